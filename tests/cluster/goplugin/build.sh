#!/usr/bin/env bash
# Builds the Go device plugin `make bench-cluster` runs beside the agent (squat's generic-device-plugin, the
# version go.mod pins, from the Go module proxy) once, into a cache outside the clone keyed by that version and a
# hash of go.mod, go.sum and this script; prints the binary's path. A second run is a cache hit.
set -euo pipefail
cd "$(dirname "$0")"
module=github.com/squat/generic-device-plugin
version=$(awk -v module="$module" '$1 == module {print $2} $1 == "require" && $2 == module {print $3}' go.mod)
[ -n "$version" ] || { echo "tests/cluster/goplugin/go.mod requires no $module version" >&2; exit 1; }
sources=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
root="${ASCEND_AGENT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/e2e}"
cache="$root/generic-device-plugin-$version-$sources"
binary="$cache/generic-device-plugin"
if [ -x "$binary" ]; then
	echo "$binary"
	exit 0
fi
mkdir -p "$cache"
# Written under a temporary name: a build cut short leaves no binary that looks whole.
nice -n 10 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$binary.partial" "$module" >&2
mv "$binary.partial" "$binary"
ls -dt "$root/generic-device-plugin-"* | tail -n +3 | xargs -r rm -rf
echo "$binary"
