#!/usr/bin/env bash
# Builds the test cluster's binary (main.go: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kubectl and embedded etcd) once, into a cache outside the clone keyed by the Kubernetes version and a hash of
# this module's sources; prints the binary's path. A second run with the same sources is a cache hit and
# builds nothing.
#
# The version is the one tests/cluster/go.mod pins, or K8S_VERSION (v1.<minor>.<patch>): any release the Go
# module proxy serves, built from a module written for it (version_module.py) beside its binary. A release that
# is not served or does not build ends in one line naming it and Go's error, exit status 2, and leaves nothing
# in the cache.
set -euo pipefail
cd "$(dirname "$0")"
pinned=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3} $1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2}' go.mod)
[ -n "$pinned" ] || { echo "tests/cluster/go.mod requires no k8s.io/kubernetes version" >&2; exit 1; }
kubernetes=${K8S_VERSION:-$pinned}
if ! [[ $kubernetes =~ ^v1\.([0-9]+)\.[0-9]+$ ]]; then
	echo "K8S_VERSION '$kubernetes': give a Kubernetes release as v1.<minor>.<patch>, e.g. v1.33.13" >&2
	exit 2
fi
minor=${BASH_REMATCH[1]}
sources=$(cat go.mod go.sum build.sh version_module.py sync_go_mod.py $(ls *.go | sort) | sha256sum | cut -c1-16)
root="${ASCEND_AGENT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/e2e}"
cache="$root/$kubernetes-$sources"
binary="$cache/k8s"
if [ -x "$binary" ]; then
	echo "$binary"
	exit 0
fi
version=k8s.io/component-base/version
ldflags="-s -w -X $version.gitVersion=$kubernetes -X $version.gitMajor=1 -X $version.gitMinor=$minor"
ldflags="$ldflags -X $version.gitTreeState=clean -X $version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
mkdir -p "$root"
# Everything is made in a directory of its own and renamed into place whole: a build cut short or refused
# leaves nothing that looks like a cache entry.
log=$(mktemp "${TMPDIR:-/tmp}/ascend-agent-k8s-$kubernetes-build-XXXXXX.log")
work=$(mktemp -d "$root/.building-$kubernetes-XXXXXX")
# Go's output stays only where the error line names it.
trap 'rm -rf "$work"; [ -s "$log" ] || rm -f "$log"' EXIT
echo $$ >"$work/pid" # whoever waits for this build can tell a live one from what a killed one left
if [ "$kubernetes" = "$pinned" ]; then
	python3 sync_go_mod.py --check >&2
	module=.
	tags=
else
	module="$work/module"
	mkdir "$module"
	tags=$(cd ../.. && python3 -m tests.cluster.version_module "$kubernetes" "$module")
fi
if ! (cd "$module" && nice -n 10 go build -mod=readonly -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" \
	-o "$work/k8s" .) >"$log" 2>&1; then
	reason=$(grep -v -e '^#' -e '^go: downloading' "$log" | head -n 1 || true)
	echo "Kubernetes $kubernetes does not build with $(go env GOVERSION): ${reason:-go build failed and printed nothing} (all of Go's output: $log)" >&2
	exit 2
fi
rm -f "$work/pid"
: >"$log"
# Another build of the same sources may have finished first: then its binary is the one.
mv -T "$work" "$cache" 2>/dev/null || [ -x "$binary" ]
# The three newest builds of this version stay (about 180 MB each); older ones go.
ls -dt "$root/$kubernetes-"* | tail -n +4 | xargs -r rm -rf
echo "$binary"
