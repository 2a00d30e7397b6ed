#!/usr/bin/env bash
# make release: what an air-gapped site installs from, written into dist/ (emptied first); see docs/release.md.
#
#   ascend-agent-<version>.oci.tar            linux/amd64 and linux/arm64 in one OCI archive (image/build.sh)
#   ascend-agent-<version>-<arch>.oci.tar     each architecture's image alone, for `ctr images import`
#   ascend-agent-<version>-<arch>.spdx.json   its SBOM (SPDX 2.3, by syft: Debian and Python packages)
#   ascend-agent-<chart version>.tgz, index.yaml   the Helm chart, packaged by Helm, as a Helm repository
#   ascend_agent-<version>-py3-none-any.whl, ascend_agent-<version>.tar.gz   the Python wheel and sdist
#   SHA256SUMS                                sha256sum's list of all of the above
#
# RELEASE_PYTHON: a Python with `build` (release/requirements.txt); RELEASE_HELM_PYTHON: one with helm-sdkpy
# (charts/requirements.txt). The Makefile's release target makes both. Root, as image/build.sh is.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${RELEASE_PYTHON:-.venv/bin/python}
helm_python=${RELEASE_HELM_PYTHON:-.venv-helm/bin/python}
arches=(amd64 arm64)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
dist=$PWD/dist
say() { echo "release: $*" >&2; }

rm -rf "$dist" && mkdir -p "$dist"
started=$SECONDS

# The SBOM tool first: a cold build takes minutes and needs no image.
syft=$(release/syft/build.sh)

multi=$dist/ascend-agent-$version.oci.tar
IMAGE_ARCHIVE=$multi image/build.sh "${arches[@]}" >/dev/null
for arch in "${arches[@]}"; do
    single=$dist/ascend-agent-$version-$arch.oci.tar
    name=$("$python" release/oci.py "$multi" "$arch" "$single")
    # Without it syft asks its project's server whether a newer syft exists.
    SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan --quiet --platform "linux/$arch" \
        --source-name "$name" --source-version "$version" \
        -o "spdx-json=$dist/ascend-agent-$version-$arch.spdx.json" "oci-archive:$single"
    say "linux/$arch: $single ($name) and its SBOM"
done

"$helm_python" release/chart.py "$dist" >/dev/null
# The sdist, then the wheel built from it, each in an isolated environment (pyproject.toml's build-system).
# -P: the clone's build/ directory is not the `build` package.
mkdir -p build
"$python" -P -m build --outdir "$dist" . >build/release-python.log 2>&1 || {
    tail -n 20 build/release-python.log >&2
    exit 1
}

(cd "$dist" && sha256sum -- * >SHA256SUMS)
say "dist/ in $((SECONDS - started)) s:"
(cd "$dist" && ls -l --block-size=K -- *) >&2
