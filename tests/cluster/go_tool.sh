#!/usr/bin/env bash
# Builds a Go program a benchmark runs beside the agent, from the Go module proxy, once, into a cache outside
# the clone keyed by the version DIR/go.mod requires and a hash of DIR's go.mod, go.sum and build.sh and of this
# script; prints the binary's path. A second run is a cache hit.
#
#     tests/cluster/go_tool.sh DIR NAME MODULE PACKAGE
#
# DIR's go.mod names PACKAGE in a tool directive: no code of it is kept in the repository.
set -euo pipefail
self=$(realpath "$0")
dir=$1 name=$2 module=$3 package=$4
cd "$dir"
version=$(awk -v module="$module" '$1 == module {print $2} $1 == "require" && $2 == module {print $3}' go.mod)
[ -n "$version" ] || { echo "$dir/go.mod requires no $module version" >&2; exit 1; }
sources=$(cat go.mod go.sum build.sh "$self" | sha256sum | cut -c1-16)
root="${ASCEND_AGENT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/e2e}"
cache="$root/$name-$version-$sources"
binary="$cache/$name"
if [ -x "$binary" ]; then
	echo "$binary"
	exit 0
fi
mkdir -p "$cache"
# Written under a temporary name: a build cut short leaves no binary that looks whole.
nice -n 10 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$binary.partial" "$package" >&2
mv "$binary.partial" "$binary"
ls -dt "$root/$name-"* | tail -n +3 | xargs -r rm -rf
echo "$binary"
