package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "ascend-agent/protos/deviceplugin/v1beta1"
)

const usage = "commands: restart | allocate RESOURCE ID,ID,... | " +
	"preferred RESOURCE SIZE AVAILABLE,... [MUST,...] | end-stream RESOURCE | quit"

// standin is the whole stand-in: the device manager and, in plugin-watcher mode, the registry watcher.
type standin struct {
	manager *deviceManager
	watcher *registryWatcher // nil without --registry-dir
	events  *emitter
}

// run reads one command a line until quit or the end of input, each answered by events.
func (s *standin) run(input io.Reader) {
	lines := bufio.NewScanner(input)
	for lines.Scan() {
		words := strings.Fields(lines.Text())
		if len(words) == 0 {
			continue
		}
		if words[0] == "quit" {
			break
		}
		if err := s.execute(words); err != nil {
			s.events.emit("error", fields{"command": lines.Text(), "message": err.Error()})
		}
	}
	s.manager.stop()
}

func (s *standin) execute(words []string) error {
	switch {
	case words[0] == "restart" && len(words) == 1:
		return s.restart()
	case words[0] == "allocate" && len(words) == 3:
		s.allocate(words[1], ids(words[2]))
	case words[0] == "preferred" && (len(words) == 4 || len(words) == 5):
		size, err := strconv.Atoi(words[2])
		if err != nil {
			return fmt.Errorf("size %q is not a number; %s", words[2], usage)
		}
		var mustInclude []string
		if len(words) == 5 {
			mustInclude = ids(words[4])
		}
		s.preferred(words[1], size, ids(words[3]), mustInclude)
	case words[0] == "end-stream" && len(words) == 2:
		return s.manager.endStream(words[1])
	default:
		return fmt.Errorf("unknown command or wrong arguments; %s", usage)
	}
	return nil
}

// restart is a kubelet restart: stop serving, close every plugin connection, wipe, serve again, and in
// plugin-watcher mode scan the registry directory again.
func (s *standin) restart() error {
	s.manager.stop()
	if s.watcher != nil {
		s.watcher.reset()
	}
	if err := s.manager.start(); err != nil {
		return fmt.Errorf("restart: %v", err)
	}
	if s.watcher != nil {
		s.watcher.rescan()
	}
	s.events.emit("restarted", nil)
	return nil
}

func (s *standin) allocate(resource string, deviceIDs []string) {
	request := &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: deviceIDs}}}
	s.call("allocate", resource, func(ctx context.Context, client pb.DevicePluginClient) (proto.Message, error) {
		return client.Allocate(ctx, request)
	})
}

func (s *standin) preferred(resource string, size int, available, mustInclude []string) {
	request := &pb.PreferredAllocationRequest{ContainerRequests: []*pb.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
	}}}
	s.call("preferred", resource, func(ctx context.Context, client pb.DevicePluginClient) (proto.Message, error) {
		return client.GetPreferredAllocation(ctx, request)
	})
}

type rpc func(context.Context, pb.DevicePluginClient) (proto.Message, error)

// call runs one RPC on the resource's connection and emits its answer: the response as JSON with the
// .proto's field names, or the gRPC status code and message.
func (s *standin) call(event, resource string, invoke rpc) {
	plugin := s.manager.plugin(resource)
	if plugin == nil {
		s.events.emit(event, fields{
			"resource": resource, "ok": false, "code": "", "message": "no plugin registered for " + resource,
		})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	response, err := invoke(ctx, plugin.client)
	if err != nil {
		answer := status.Convert(err)
		s.events.emit(event, fields{
			"resource": resource, "ok": false, "code": answer.Code().String(), "message": answer.Message(),
		})
		return
	}
	encoded, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(response)
	if err != nil {
		s.events.emit(event, fields{"resource": resource, "ok": false, "code": "", "message": err.Error()})
		return
	}
	s.events.emit(event, fields{"resource": resource, "ok": true, "response": json.RawMessage(encoded)})
}

// ids splits "a,b,c"; "-" is the empty list.
func ids(list string) []string {
	if list == "-" || list == "" {
		return []string{}
	}
	return strings.Split(list, ",")
}
