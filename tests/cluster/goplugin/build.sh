#!/usr/bin/env bash
# Builds the Go device plugin `make bench-cluster` runs beside the agent (squat's generic-device-plugin, the
# version go.mod pins, from the Go module proxy) once into a cache outside the clone; prints the binary's path.
set -euo pipefail
module=github.com/squat/generic-device-plugin
exec "$(dirname "$0")/../go_tool.sh" "$(dirname "$0")" generic-device-plugin "$module" "$module"
