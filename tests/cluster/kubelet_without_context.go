//go:build kubelet_without_context

package main

import (
	"k8s.io/component-base/cli"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// runKubelet runs the kubelet's own command as Kubernetes before 1.34 makes it (build.sh sets the tag).
func runKubelet() int {
	return cli.Run(kubelet.NewKubeletCommand())
}
