//go:build !kubelet_without_context

package main

import (
	"context"

	"k8s.io/component-base/cli"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// runKubelet runs the kubelet's own command (from Kubernetes 1.34 it takes a context).
func runKubelet() int {
	return cli.Run(kubelet.NewKubeletCommand(context.Background()))
}
