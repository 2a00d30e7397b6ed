// Command kubelet-standin behaves as the kubelet's device manager and plugin watcher do, on grpc-go, for
// the interop tests: commands on stdin, events on stdout as JSON lines.
//
//	kubelet-standin --dir /tmp/k [--registry-dir /tmp/r]
//	> restart
//	< {"event":"listening","socket":"/tmp/k/kubelet.sock","removed":["/tmp/k/Ascend910.sock"],"t":...}
//	< {"event":"restarted","t":...}
//	< {"event":"register","via":"kubelet.sock","resource":"huawei.com/Ascend910","ok":true,...}
//	< {"event":"devices","resource":"huawei.com/Ascend910","devices":[{"id":"Ascend910-0",...}],...}
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	dir := flag.String("dir", "", "the device-plugins directory: wiped of sockets at every start; kubelet.sock is served there")
	registryDir := flag.String("registry-dir", "", "the plugin watcher's directory (plugins_registry); empty: no plugin watcher")
	flag.Parse()
	if *dir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "kubelet-standin: usage: kubelet-standin --dir DIR [--registry-dir DIR]")
		os.Exit(2)
	}
	events := newEmitter(os.Stdout)
	stand := &standin{manager: newDeviceManager(*dir, events), events: events}
	if err := stand.manager.start(); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-standin: cannot serve in %s: %v\n", *dir, err)
		os.Exit(1)
	}
	if *registryDir != "" {
		stand.watcher = newRegistryWatcher(*registryDir, stand.manager, events)
		if err := stand.watcher.start(); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet-standin: %v\n", err)
			os.Exit(1)
		}
	}
	stand.run(os.Stdin)
}
