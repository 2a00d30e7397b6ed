#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, the version go.mod pins, from the Go module proxy), which keeps the fake Nodes of
# `make bench-scale` Ready, once into a cache outside the clone; prints the binary's path. Beside the binary:
# the node stages kwok's module ships (a node made Ready, then its heartbeat by Lease), which kwok is told (-c).
set -euo pipefail
here=$(dirname "$0")
module=sigs.k8s.io/kwok
binary=$("$here/../go_tool.sh" "$here" kwok "$module" "$module/cmd/kwok")
stages="$(dirname "$binary")/stages"
if [ ! -d "$stages" ]; then
	version=$(awk -v module="$module" '$1 == module {print $2}' "$here/go.mod")
	shipped="$(go env GOMODCACHE)/$module@$version/kustomize/stage/node"
	mkdir -p "$stages.partial"
	cp "$shipped/fast/node-initialize.yaml" "$shipped/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
		"$stages.partial/"
	mv "$stages.partial" "$stages"
fi
echo "$binary"
