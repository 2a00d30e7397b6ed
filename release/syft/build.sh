#!/usr/bin/env bash
# Builds syft (github.com/anchore/syft, the version go.mod pins, from the Go module proxy), which writes the SBOM
# of each image `make release` builds, once into a cache outside the clone; prints the binary's path.
set -euo pipefail
here=$(dirname "$0")
module=github.com/anchore/syft
"$here/../../tests/cluster/go_tool.sh" "$here" syft "$module" "$module/cmd/syft"
