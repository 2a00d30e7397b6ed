package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd serves one etcd member for the API server: no fsync (a test cluster's data is thrown away), the
// peer URL on loopback. It stops on SIGTERM or SIGINT.
func runEtcd() int {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "", "the member's directory")
	clientURL := flags.String("listen-client-url", "http://127.0.0.1:2379", "where clients connect")
	peerURL := flags.String("listen-peer-url", "http://127.0.0.1:2380", "the member's peer URL (nobody joins)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-url %q: %v\n", *clientURL, err)
		return 2
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-url %q: %v\n", *peerURL, err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer server.Close()
	<-server.Server.ReadyNotify()
	fmt.Fprintf(os.Stderr, "etcd: ready at %s\n", client)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return 0
	case err := <-server.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
