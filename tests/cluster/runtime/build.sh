#!/usr/bin/env bash
# Builds the real node's container runtime from the Go module proxy, once, into a cache outside the clone keyed
# by each component's version and this script's hash; prints one line per binary: `NAME PATH`. A second run
# builds nothing.
#
#   containerd, ctr, containerd-shim-runc-v2   github.com/containerd/containerd/v2   (no cgo)
#   runc                                       github.com/opencontainers/runc         (cgo, seccomp)
#   bridge, loopback, host-local               github.com/containernetworking/plugins
#
# runc's seccomp needs libseccomp-dev (Debian); as root it is installed when missing.
set -euo pipefail
cd "$(dirname "$0")"

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.10.0}

root="${ASCEND_AGENT_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/node}"
recipe=$(sha256sum build.sh | cut -c1-12)
mkdir -p "$root"
# One build at a time in the cache: two at once would race for the same directories.
exec 9>"$root/.lock"
flock 9
say() { echo "node build: $*" >&2; }

command -v go >/dev/null || { say "no go on PATH; install Go 1.26 or newer"; exit 1; }

# build NAME VERSION ENV... -- GO_INSTALL_ARGS...: `go install` into NAME-VERSION-RECIPE/ unless it is there.
# Built into a temporary directory renamed in whole: a build cut short leaves nothing that looks done.
build() {
    local name=$1 version=$2
    shift 2
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    local cache="$root/$name-$version-$recipe"
    if [ ! -d "$cache" ]; then
        local partial="$cache.partial"
        rm -rf "$partial"
        mkdir -p "$partial"
        local started=$SECONDS
        if ! env GOBIN="$partial" "${env[@]}" nice -n 10 go install -trimpath -ldflags "-s -w" "$@" >&2; then
            rm -rf "$partial"
            say "$name $version did not build (the go error above)"
            exit 2
        fi
        mv "$partial" "$cache"
        say "$name $version built in $((SECONDS - started)) s"
        # The three newest builds of the component stay (a cluster may still run from one); older ones go.
        ls -dt "$root/$name-v"* | grep -v '\.partial$' | tail -n +4 | xargs -r rm -rf
    fi
    local binary
    for binary in "$cache"/*; do
        echo "$(basename "$binary") $binary"
    done
}

if ! [ -e /usr/include/seccomp.h ]; then
    [ "$(id -u)" = 0 ] || { say "runc needs Debian's libseccomp-dev; install it (as root) and run again"; exit 1; }
    say "installing libseccomp-dev"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq libseccomp-dev >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq libseccomp-dev >/dev/null; }
fi

module=github.com/containerd/containerd/v2
build containerd "$CONTAINERD_VERSION" CGO_ENABLED=0 -- -tags "no_btrfs urfave_cli_no_docs" \
    "$module/cmd/containerd@$CONTAINERD_VERSION" "$module/cmd/ctr@$CONTAINERD_VERSION"
build containerd-shim "$CONTAINERD_VERSION" CGO_ENABLED=0 -- -tags "no_grpc urfave_cli_no_docs" \
    "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
build runc "$RUNC_VERSION" CGO_ENABLED=1 -- -tags "seccomp urfave_cli_no_docs" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
plugins=github.com/containernetworking/plugins/plugins
build cni-plugins "$CNI_PLUGINS_VERSION" CGO_ENABLED=0 -- \
    "$plugins/main/bridge@$CNI_PLUGINS_VERSION" "$plugins/main/loopback@$CNI_PLUGINS_VERSION" \
    "$plugins/ipam/host-local@$CNI_PLUGINS_VERSION"
