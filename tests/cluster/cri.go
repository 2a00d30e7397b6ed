package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	criutil "k8s.io/cri-client/pkg/util"
)

// recordingRuntime is cri-client's fake runtime (images "pulled" at once, containers that never exit), except
// that each CreateContainer request is written whole, as JSON, to a file of its own in dir: its devices, mounts,
// envs, annotations and CDI devices are what the kubelet hands the runtime, and what the tests check.
type recordingRuntime struct {
	*fake.RemoteRuntime
	dir   string
	count atomic.Int64
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	answer, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	record, err := protojson.MarshalOptions{Multiline: true}.Marshal(&runtimeapi.CreateContainerRequest{
		PodSandboxId:  req.PodSandboxId,
		Config:        req.Config,
		SandboxConfig: req.SandboxConfig,
	})
	if err != nil {
		return nil, fmt.Errorf("recording the CreateContainer request: %w", err)
	}
	// The file appears whole: written under a temporary name, then renamed.
	name := fmt.Sprintf("%06d-%s.json", r.count.Add(1), answer.ContainerId)
	temporary := filepath.Join(r.dir, "."+name)
	if err := os.WriteFile(temporary, record, 0o644); err != nil {
		return nil, fmt.Errorf("recording the CreateContainer request: %w", err)
	}
	if err := os.Rename(temporary, filepath.Join(r.dir, name)); err != nil {
		return nil, fmt.Errorf("recording the CreateContainer request: %w", err)
	}
	return answer, nil
}

func runRecordingRuntime() int {
	flags := flag.NewFlagSet("cri", flag.ContinueOnError)
	endpoint := flags.String("listen", "", "the runtime's unix socket, as unix:///path/to/cri.sock")
	dir := flags.String("record-dir", "", "where each CreateContainer request is written, one JSON file each")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *endpoint == "" || *dir == "" {
		fmt.Fprintln(os.Stderr, "cri: usage: cri --listen unix:///path/cri.sock --record-dir DIR")
		return 2
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "cri: %v\n", err)
		return 1
	}
	runtime := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), dir: *dir}
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	// The kubelet refuses an image whose size is 0 ("Id or size of image ... is not set").
	runtime.ImageService.SetFakeImageSize(1 << 20)
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, runtime)
	runtimeapi.RegisterImageServiceServer(server, runtime.RemoteRuntime)
	listener, err := criutil.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri: cannot listen on %s: %v\n", *endpoint, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cri: serving %s, recording to %s\n", *endpoint, *dir)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "cri: %v\n", err)
		return 1
	}
	return 0
}
