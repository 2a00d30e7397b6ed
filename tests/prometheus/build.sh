#!/usr/bin/env bash
# Builds Prometheus' promtool and server (github.com/prometheus/prometheus, the version go.mod pins, from the Go
# module proxy) once each into a cache outside the clone; prints promtool's path, then the server's, one a line.
set -euo pipefail
here=$(dirname "$0")
module=github.com/prometheus/prometheus
"$here/../cluster/go_tool.sh" "$here" promtool "$module" "$module/cmd/promtool"
"$here/../cluster/go_tool.sh" "$here" prometheus "$module" "$module/cmd/prometheus"
