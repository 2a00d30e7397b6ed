#!/usr/bin/env bash
# make image: the node image from the Containerfile with buildah (no daemon), for each architecture asked
# (default: amd64 arm64), as one OCI archive holding an index of them:
#
#   image/build.sh [ARCH...]     # prints the archive's path: build/image/ascend-agent-<version>.oci.tar
#   IMAGE_ARCHIVE=FILE image/build.sh amd64       # the archive written to FILE instead
#
# The image is named docker.io/library/ascend-agent:<version> in the archive, what the chart's default image
# ascend-agent:<version> means to a container runtime (`ctr -n k8s.io images import` names it so), and
# localhost/ascend-agent:<version>-<arch> in buildah's storage. An architecture other than this machine's
# builds under emulation (Debian's qemu-user-static through binfmt_misc, registered here when missing);
# where the kernel refuses that, the others are built and the refusal is printed.
#
# Base: the Containerfile's default (BASE_IMAGE=<image> to choose another), pulled; when it cannot be pulled,
# a Debian bookworm base made by debootstrap (image/debian-base.sh). buildah's storage (vfs driver, chroot
# isolation) with the bases and the layer cache lives outside the clone, in
# ${ASCEND_AGENT_IMAGE_CACHE:-~/.cache/ascend-agent/image}: a second build of the same tree builds nothing.
# Runs as root; installs buildah, debootstrap and qemu-user-static with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
source image/store.sh
out=$PWD/build/image
archive=${IMAGE_ARCHIVE:-$out/ascend-agent-$version.oci.tar}
native=$(dpkg --print-architecture 2>/dev/null || echo amd64)

say() { echo "image: $*" >&2; }
die() {
    echo "image: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (buildah builds images as root here); run it with sudo"
mkdir -p "$cache"
# One build in the storage at a time (a clone beside this one, make image-test, make e2e).
exec 9>"$cache/.lock"
flock 9
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap debian-archive-keyring)
for arch in "${arches[@]}"; do
    [ "$arch" = "$native" ] || command -v update-binfmts >/dev/null || missing+=(qemu-user-static binfmt-support)
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "needs ${missing[*]}; install them with the system's package manager"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
mkdir -p "$cache" "$out"

# emulation ARCH: whether this kernel runs ARCH's binaries (qemu through binfmt_misc), registering it first.
emulation() {
    local qemu
    case $1 in
    arm64) qemu=qemu-aarch64 ;;
    *) qemu=qemu-$1 ;;
    esac
    local misc=/proc/sys/fs/binfmt_misc
    if [ ! -e "$misc/register" ]; then
        mount -t binfmt_misc binfmt_misc "$misc" 2>"$cache/binfmt.log" || {
            say "linux/$1 not built: mount binfmt_misc: $(cat "$cache/binfmt.log")"
            return 1
        }
    fi
    if [ ! -e "$misc/$qemu" ]; then
        update-binfmts --enable "$qemu" >"$cache/binfmt.log" 2>&1 || {
            say "linux/$1 not built: update-binfmts --enable $qemu: $(cat "$cache/binfmt.log")"
            return 1
        }
    fi
}

default_base=$(sed -n 's/^ARG BASE_IMAGE=//p' Containerfile)
[ -n "$default_base" ] || die "Containerfile declares no ARG BASE_IMAGE=<default>"

# base ARCH: the image to build on for ARCH (the default pulled, else the Debian base).
base() {
    local wanted=${BASE_IMAGE:-$default_base}
    # A pulled base is kept under a name of its architecture's: one name would be pulled again for each.
    local kept
    kept=localhost/ascend-agent-base:pulled-$1-$(printf '%s' "$wanted" | sha256sum | cut -c1-12)
    if "${store[@]}" inspect --type image "$kept" >/dev/null 2>&1; then
        echo "$kept"
    elif timeout 300 "${store[@]}" pull --quiet --arch "$1" "$wanted" >/dev/null 2>"$cache/pull-$1.log" &&
        "${store[@]}" tag "$wanted" "$kept"; then
        echo "$kept"
    else
        say "cannot pull $wanted for $1 (why: $cache/pull-$1.log); using a Debian base made by debootstrap"
        image/debian-base.sh "$cache" "$1"
    fi
}

# pip in the build trusts what this host trusts (a TLS-inspecting proxy, a private index's CA): the host's
# CA bundle is mounted over the base's during the RUN steps only, never copied into the image.
mounts=()
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] && mounts+=(--volume "$ca:$ca:ro")

"${store[@]}" manifest rm "$list" >/dev/null 2>&1 || true
"${store[@]}" manifest create "$list" >/dev/null
built=()
for arch in "${arches[@]}"; do
    if [ "$arch" != "$native" ] && ! emulation "$arch"; then
        "${store[@]}" rmi -f "$list-$arch" >/dev/null 2>&1 || true # an older build is no build of this tree
        continue
    fi
    started=$SECONDS
    from=$(base "$arch")
    image=$list-$arch
    log=$out/build-$arch.log
    # An emulated build takes minutes; an hour is a hang.
    timeout 3600 "${store[@]}" build --layers --arch "$arch" --os linux --build-arg "BASE_IMAGE=$from" "${mounts[@]}" \
        -f Containerfile -t "$image" . >"$log" 2>&1 || {
        tail -n 20 "$log" >&2
        die "buildah build for linux/$arch failed; the whole log is $log"
    }
    "${store[@]}" manifest add --arch "$arch" --os linux "$list" "$image" >/dev/null
    say "linux/$arch: $image, $("${store[@]}" images --format '{{.Size}}' "$image") uncompressed, built in $((SECONDS - started)) s"
    built+=("$arch")
done
[ ${#built[@]} -gt 0 ] || die "no architecture was built"

# With vfs every layer is a full copy of the tree, so the dangling layers of earlier builds go; the bases,
# the tagged images and the layer cache of these builds stay.
keep=$(cat "$out"/build-*.log | grep -oE '^--> (Using cache )?[0-9a-f]{11,}' | grep -oE '[0-9a-f]{11}' | sort -u) || true
for id in $("${store[@]}" images --all --format '{{.ID}} {{.Name}}' | awk '$2 == "<none>" { print $1 }'); do
    grep -qx "${id:0:11}" <<<"$keep" || "${store[@]}" rmi "$id" >/dev/null 2>&1 || true
done

rm -f "$archive"
"${store[@]}" manifest push --quiet --all "$list" "oci-archive:$archive:docker.io/library/ascend-agent:$version" >/dev/null
say "$archive: linux/${built[*]}"
echo "$archive"
