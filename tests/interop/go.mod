// The grpc-go kubelet stand-in (kubelet/), the device-info decoder (deviceinfo/) and the rank-table decoder
// (ranktable/), built by `make interop` against the grpc-go and protobuf versions k8s.io/kubernetes v1.36.3 requires.
module ascend-agent/interop

go 1.26.0

require (
	// Generated from protos/ by `make interop` into build/interop/protos (a module of its own, not committed).
	ascend-agent/protos v0.0.0
	golang.org/x/sys v0.40.0
	google.golang.org/grpc v1.79.3
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
)

require (
	golang.org/x/net v0.48.0 // indirect
	golang.org/x/text v0.32.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251202230838-ff82c1b0f217 // indirect
)

replace ascend-agent/protos => ../../build/interop/protos
