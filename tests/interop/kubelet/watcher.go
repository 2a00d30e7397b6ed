package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	reg "ascend-agent/protos/pluginregistration/v1"
)

const (
	devicePluginType = "DevicePlugin"
	// The kubelet's plugin manager acts on its directory about once a second; a failed registration is
	// tried again after that long.
	retryInterval = time.Second
)

// registryWatcher is the kubelet's plugin manager for device plugins: each socket in its directory,
// present at a (re)start or created later, is asked for its PluginInfo and, if valid, connected through
// the device manager; NotifyRegistrationStatus tells the plugin the outcome. Removing the socket
// deregisters it.
type registryWatcher struct {
	dir     string
	manager *deviceManager
	events  *emitter

	mu         sync.Mutex
	registered map[string]string // registry socket -> resource
	inFlight   map[string]bool   // registry sockets with an attempt running or waiting to retry
}

func newRegistryWatcher(dir string, manager *deviceManager, events *emitter) *registryWatcher {
	return &registryWatcher{
		dir: dir, manager: manager, events: events,
		registered: map[string]string{}, inFlight: map[string]bool{},
	}
}

// start watches the directory (first, so no socket created meanwhile is missed), then scans it.
func (w *registryWatcher) start() error {
	if err := os.MkdirAll(w.dir, 0o750); err != nil {
		return err
	}
	if err := watchDirectory(w.dir, w.consider, w.forget); err != nil {
		return fmt.Errorf("watching %s: %v", w.dir, err)
	}
	w.rescan()
	return nil
}

// reset forgets every registration: the device manager has closed their connections.
func (w *registryWatcher) reset() {
	w.mu.Lock()
	w.registered = map[string]string{}
	w.mu.Unlock()
}

// rescan considers every socket in the directory, as the kubelet's plugin watcher does when it starts.
func (w *registryWatcher) rescan() {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		w.events.emit("error", fields{"message": "scanning " + w.dir + ": " + err.Error()})
		return
	}
	for _, entry := range entries {
		w.consider(entry.Name())
	}
}

// consider registers the socket name, unless it starts with a dot: the kubelet's plugin watcher skips those
// (a plugin may bind under a dot name and rename the socket in once it listens).
func (w *registryWatcher) consider(name string) {
	if strings.HasPrefix(name, ".") {
		return
	}
	path := filepath.Join(w.dir, name)
	if info, err := os.Stat(path); err != nil || info.Mode()&os.ModeSocket == 0 {
		return
	}
	w.mu.Lock()
	_, registered := w.registered[path]
	w.mu.Unlock()
	if registered {
		// A new socket renamed over the registered one (no delete came first): the kubelet's plugin manager
		// records it under a new UUID and so deregisters the old and registers it anew.
		w.forget(name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, done := w.registered[path]; done || w.inFlight[path] {
		return
	}
	w.inFlight[path] = true
	go w.keepTrying(path)
}

func (w *registryWatcher) forget(name string) {
	path := filepath.Join(w.dir, name)
	w.mu.Lock()
	resource, found := w.registered[path]
	delete(w.registered, path)
	w.mu.Unlock()
	if found {
		// The kubelet deregisters a removed socket it had registered whether or not the plugin's stream is
		// still open: a plugin that sees its socket gone serves again, ending the stream, at once.
		w.manager.disconnect(resource, path)
		w.events.emit("deregistered", fields{"resource": resource, "registry": path})
	}
}

// keepTrying registers the socket at path until it is registered, again every retryInterval while it
// fails and the socket is there; at once if the device manager restarted meanwhile (a rescan skips a
// socket in flight, so this attempt must cover it).
func (w *registryWatcher) keepTrying(path string) {
	for {
		generation := w.manager.currentGeneration()
		err := w.register(path, generation)
		w.mu.Lock()
		if _, registered := w.registered[path]; registered {
			delete(w.inFlight, path)
			w.mu.Unlock()
			break
		}
		w.mu.Unlock()
		if err != nil && w.manager.currentGeneration() == generation {
			time.Sleep(retryInterval)
		}
		if _, err := os.Stat(path); err != nil {
			w.mu.Lock()
			delete(w.inFlight, path)
			w.mu.Unlock()
			return
		}
	}
	// Removed while it was being registered: its deletion found nothing to deregister.
	if _, err := os.Stat(path); err != nil {
		w.forget(filepath.Base(path))
	}
}

// register is one attempt: GetInfo, validate, connect the endpoint, record it, NotifyRegistrationStatus.
func (w *registryWatcher) register(path string, generation int) error {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	outcome := fields{"via": "plugin-watcher", "registry": path}
	conn, err := grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(countedDialer(w.events, path)),
	)
	if err != nil {
		return w.report(outcome, fmt.Errorf("failed to dial the registration socket: %v", err))
	}
	defer conn.Close()
	client := reg.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &reg.InfoRequest{})
	if err != nil {
		return w.report(outcome, fmt.Errorf("GetInfo failed: %v", err))
	}
	endpoint := info.Endpoint
	if endpoint == "" {
		endpoint = path
	}
	outcome["resource"] = info.Name
	outcome["endpoint"] = endpoint
	outcome["type"] = info.Type
	outcome["versions"] = info.SupportedVersions
	err = validateInfo(info)
	if err == nil {
		_, err = w.manager.connect(context.Background(), generation, info.Name, endpoint, path)
	}
	if err == nil {
		err = w.record(path, info.Name, generation)
	}
	status := &reg.RegistrationStatus{PluginRegistered: err == nil, Error: errorText(err)}
	_, notifyErr := client.NotifyRegistrationStatus(ctx, status)
	outcome["notify_error"] = errorText(notifyErr)
	if err == nil && notifyErr != nil {
		w.forget(filepath.Base(path))
		err = fmt.Errorf("NotifyRegistrationStatus failed: %v", notifyErr)
	}
	return w.report(outcome, err)
}

// record notes the registration, unless the device manager restarted since generation (and so closed it).
func (w *registryWatcher) record(path, resource string, generation int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.manager.currentGeneration() != generation {
		return errors.New("the kubelet restarted during the registration")
	}
	w.registered[path] = resource
	return nil
}

func (w *registryWatcher) report(outcome fields, err error) error {
	outcome["ok"] = err == nil
	outcome["error"] = errorText(err)
	w.events.emit("register", outcome)
	return err
}

func validateInfo(info *reg.PluginInfo) error {
	if info.Type != devicePluginType {
		return fmt.Errorf(`plugin type "%s" is not handled: only "%s"`, info.Type, devicePluginType)
	}
	for _, version := range info.SupportedVersions {
		if version == apiVersion {
			if !isExtendedResourceName(info.Name) {
				return fmt.Errorf(`the ResourceName "%s" is invalid`, info.Name)
			}
			return nil
		}
	}
	return fmt.Errorf(`plugin %s supports versions [%s], not "%s"`,
		info.Name, strings.Join(info.SupportedVersions, " "), apiVersion)
}

// watchDirectory calls created(name) for every entry created or moved into dir, removed(name) for every
// one deleted or moved out, from a goroutine of its own.
func watchDirectory(dir string, created, removed func(name string)) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return err
	}
	mask := uint32(unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM)
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return err
	}
	go func() {
		buffer := make([]byte, 64*1024)
		for {
			count, err := unix.Read(fd, buffer)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			for offset := 0; offset+unix.SizeofInotifyEvent <= count; {
				event := (*unix.InotifyEvent)(unsafe.Pointer(&buffer[offset]))
				start := offset + unix.SizeofInotifyEvent
				name := strings.TrimRight(string(buffer[start:start+int(event.Len)]), "\x00")
				offset = start + int(event.Len)
				if event.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
					created(name)
				} else if event.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0 {
					removed(name)
				}
			}
		}
	}()
	return nil
}
