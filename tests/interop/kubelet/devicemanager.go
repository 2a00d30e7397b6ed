package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "ascend-agent/protos/deviceplugin/v1beta1"
)

const (
	apiVersion    = "v1beta1"
	kubeletSocket = "kubelet.sock"
	// The kubelet's blocking dial of a plugin's endpoint gives up after 10 s.
	dialTimeout = 10 * time.Second
	rpcTimeout  = 10 * time.Second
)

// deviceManager is the kubelet's device manager: it serves Registration on DIR/kubelet.sock and, inside
// Register, dials the plugin back, asks for its options and follows its ListAndWatch stream.
type deviceManager struct {
	dir    string
	events *emitter

	mu sync.Mutex
	// generation counts starts: a registration begun under an earlier one is dropped, as a restarted
	// kubelet knows nothing of it.
	generation int
	server     *grpc.Server
	plugins    map[string]*pluginConn // by resource name
}

// pluginConn is one registration's connection to a plugin: its own ClientConn, as the kubelet's.
type pluginConn struct {
	resource   string
	socket     string
	registry   string // the plugin watcher's socket it came through, "" for kubelet.sock
	conn       *grpc.ClientConn
	client     pb.DevicePluginClient
	stopStream context.CancelFunc
}

func (p *pluginConn) close() {
	p.stopStream()
	p.conn.Close()
}

func newDeviceManager(dir string, events *emitter) *deviceManager {
	return &deviceManager{dir: dir, events: events, plugins: map[string]*pluginConn{}}
}

// start creates the directory, removes every socket in it and serves Registration on kubelet.sock.
func (m *deviceManager) start() error {
	if err := os.MkdirAll(m.dir, 0o750); err != nil {
		return err
	}
	sockets, err := filepath.Glob(filepath.Join(m.dir, "*.sock"))
	if err != nil {
		return err
	}
	for _, socket := range sockets {
		if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	path := filepath.Join(m.dir, kubeletSocket)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	pb.RegisterRegistrationServer(server, &registrationService{manager: m})
	m.mu.Lock()
	m.server = server
	m.mu.Unlock()
	go func() {
		if err := server.Serve(listener); err != nil {
			m.events.emit("error", fields{"message": "serving kubelet.sock: " + err.Error()})
		}
	}()
	m.events.emit("listening", fields{"socket": path, "removed": sockets})
	return nil
}

// stop ends serving (kubelet.sock goes with its listener) and closes every plugin connection.
func (m *deviceManager) stop() {
	m.mu.Lock()
	server := m.server
	plugins := m.plugins
	m.server = nil
	m.plugins = map[string]*pluginConn{}
	m.generation++
	m.mu.Unlock()
	if server != nil {
		server.Stop()
	}
	for _, plugin := range plugins {
		plugin.close()
	}
}

func (m *deviceManager) currentGeneration() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.generation
}

func (m *deviceManager) plugin(resource string) *pluginConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.plugins[resource]
}

// connect dials the plugin at socket as the kubelet does (a fresh ClientConn, blocking, 10 s, authority
// localhost), asks for its options, replaces the resource's previous connection and follows ListAndWatch
// in the background. It fails if the device manager restarted since generation.
func (m *deviceManager) connect(
	ctx context.Context, generation int, resource, socket, registry string,
) (*pb.DevicePluginOptions, error) {
	dialCtx, cancelDial := context.WithTimeout(ctx, dialTimeout)
	defer cancelDial()
	conn, err := grpc.DialContext(dialCtx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(countedDialer(m.events, resource)),
	)
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %v", err)
	}
	client := pb.NewDevicePluginClient(conn)
	optionsCtx, cancelOptions := context.WithTimeout(ctx, rpcTimeout)
	defer cancelOptions()
	options, err := client.GetDevicePluginOptions(optionsCtx, &pb.Empty{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("failed to get device plugin options: %v", err)
	}
	streamCtx, stopStream := context.WithCancel(context.Background())
	plugin := &pluginConn{resource, socket, registry, conn, client, stopStream}
	m.mu.Lock()
	if m.generation != generation {
		m.mu.Unlock()
		plugin.close()
		return nil, errors.New("the kubelet restarted during the registration")
	}
	previous := m.plugins[resource]
	m.plugins[resource] = plugin
	m.mu.Unlock()
	if previous != nil {
		previous.close()
	}
	m.events.emit("registered", fields{
		"resource": resource, "socket": socket, "registry": registry, "options": optionsFields(options),
	})
	go m.follow(streamCtx, plugin)
	return options, nil
}

// disconnect drops the resource's connection if it came through the given registry socket.
func (m *deviceManager) disconnect(resource, registry string) bool {
	m.mu.Lock()
	plugin := m.plugins[resource]
	if plugin == nil || plugin.registry != registry {
		m.mu.Unlock()
		return false
	}
	delete(m.plugins, resource)
	m.mu.Unlock()
	plugin.close()
	return true
}

// endStream ends the resource's ListAndWatch stream, as a kubelet that dropped it (it never re-dials).
func (m *deviceManager) endStream(resource string) error {
	m.mu.Lock()
	plugin := m.plugins[resource]
	delete(m.plugins, resource)
	m.mu.Unlock()
	if plugin == nil {
		return fmt.Errorf("no stream open for %s", resource)
	}
	plugin.close()
	return nil
}

// follow reports every ListAndWatch message; when the stream ends the connection is closed, as the
// kubelet's is.
func (m *deviceManager) follow(ctx context.Context, plugin *pluginConn) {
	stream, err := plugin.client.ListAndWatch(ctx, &pb.Empty{})
	for err == nil {
		var response *pb.ListAndWatchResponse
		if response, err = stream.Recv(); err == nil {
			m.events.emit("devices", fields{"resource": plugin.resource, "devices": deviceFields(response)})
		}
	}
	m.events.emit("stream-ended", fields{"resource": plugin.resource, "error": err.Error()})
	m.mu.Lock()
	if m.plugins[plugin.resource] == plugin {
		delete(m.plugins, plugin.resource)
	}
	m.mu.Unlock()
	plugin.close()
}

type registrationService struct {
	pb.UnimplementedRegistrationServer
	manager *deviceManager
}

// Register validates the request, then connects to the plugin before answering, as the kubelet does.
func (s *registrationService) Register(ctx context.Context, request *pb.RegisterRequest) (*pb.Empty, error) {
	generation := s.manager.currentGeneration()
	err := validateRegistration(request.Version, request.ResourceName)
	if err == nil {
		socket := filepath.Join(s.manager.dir, request.Endpoint)
		_, err = s.manager.connect(ctx, generation, request.ResourceName, socket, "")
	}
	s.manager.events.emit("register", fields{
		"via": "kubelet.sock", "resource": request.ResourceName, "endpoint": request.Endpoint,
		"version": request.Version, "options": optionsFields(request.Options),
		"ok": err == nil, "error": errorText(err),
	})
	if err != nil {
		return nil, err
	}
	return &pb.Empty{}, nil
}

// validateRegistration checks what the kubelet checks, with its error texts.
func validateRegistration(version, resource string) error {
	if version != apiVersion {
		return fmt.Errorf(`requested API version "%s" is not supported by kubelet`, version)
	}
	if !isExtendedResourceName(resource) {
		return fmt.Errorf(`the ResourceName "%s" is invalid`, resource)
	}
	return nil
}

// isExtendedResourceName: a domain-qualified name outside kubernetes.io that does not start "requests.".
func isExtendedResourceName(name string) bool {
	return strings.Contains(name, "/") && !strings.Contains(name, "kubernetes.io/") &&
		!strings.HasPrefix(name, "requests.")
}

// countedDialer connects over the unix socket and reports every attempt, so a test can see grpc-go's
// retries (the first one comes about 1 s after a failed connect).
func countedDialer(events *emitter, label string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, address string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", address)
		events.emit("dial", fields{"for": label, "socket": address, "ok": err == nil, "error": errorText(err)})
		return conn, err
	}
}

func optionsFields(options *pb.DevicePluginOptions) fields {
	return fields{
		"pre_start_required":                 options.GetPreStartRequired(),
		"get_preferred_allocation_available": options.GetGetPreferredAllocationAvailable(),
	}
}

func deviceFields(response *pb.ListAndWatchResponse) []fields {
	devices := make([]fields, 0, len(response.Devices))
	for _, device := range response.Devices {
		numa := []int64{}
		for _, node := range device.GetTopology().GetNodes() {
			numa = append(numa, node.ID)
		}
		devices = append(devices, fields{"id": device.ID, "health": device.Health, "numa": numa})
	}
	return devices
}
