// k8s is one binary for a single-node test cluster, built from Kubernetes' own Go modules (the version is pinned
// in go.mod): run as `k8s COMPONENT ARGS...`, or through a link named after the component. Each component runs
// as a process of its own, as in a real cluster.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() int{
	"etcd":                    runEtcd,
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":                 runKubelet,
	"kubectl":                 runKubectl,
}

func runKubectl() int {
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func main() {
	program := filepath.Base(os.Args[0])
	name := program
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// `k8s kubelet --flag`: the component reads os.Args as if it had been started by its own name.
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: %s COMPONENT ARGS... where COMPONENT is one of %s\n",
			program, strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run())
}
