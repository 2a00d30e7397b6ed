#!/usr/bin/env bash
# Builds the test cluster's binary (main.go: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kubectl and embedded etcd) once, into a cache outside the clone keyed by the
# Kubernetes version and a hash of this module's sources; prints the binary's path. A second run with the same
# sources is a cache hit and builds nothing.
set -euo pipefail
cd "$(dirname "$0")"
kubernetes=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3} $1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2}' go.mod)
[ -n "$kubernetes" ] || { echo "tests/cluster/go.mod requires no k8s.io/kubernetes version" >&2; exit 1; }
minor=${kubernetes#v1.}; minor=${minor%%.*}
sources=$(cat go.mod go.sum build.sh $(ls *.go | sort) | sha256sum | cut -c1-16)
root="${ASCEND_AGENT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/e2e}"
cache="$root/$kubernetes-$sources"
binary="$cache/k8s"
if [ -x "$binary" ]; then
	echo "$binary"
	exit 0
fi
python3 sync_go_mod.py --check >&2
mkdir -p "$cache"
version=k8s.io/component-base/version
ldflags="-s -w -X $version.gitVersion=$kubernetes -X $version.gitMajor=1 -X $version.gitMinor=$minor"
ldflags="$ldflags -X $version.gitTreeState=clean -X $version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
# Written under a temporary name: a build cut short leaves no binary that looks whole.
nice -n 10 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$binary.partial" . >&2
mv "$binary.partial" "$binary"
# The three newest builds of this version stay (about 180 MB each); older ones go.
ls -dt "$root/$kubernetes-"* | tail -n +4 | xargs -r rm -rf
echo "$binary"
