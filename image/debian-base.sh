#!/usr/bin/env bash
# A Debian base image made with debootstrap, for building the Containerfile where its default base cannot be
# pulled. It stands in for python:3.11-slim-bookworm: Debian bookworm's Python 3.11 with pip, `python` and
# `pip` on PATH, pip allowed to install into the system (as in the python images).
#
#   image/debian-base.sh STORAGE_ROOT [ARCH]   # prints the image name; builds it once, then reuses it
#
# ARCH is a Debian architecture (amd64, arm64); another than this machine's runs debootstrap's second stage
# under emulation (binfmt_misc and qemu-user-static, which image/build.sh sets up). The packages come from
# apt's own Debian mirror for bookworm, read at run time (apt-get indextargets), else debootstrap's default;
# DEBIAN_MIRROR=<url> overrides both.
set -euo pipefail

root=$1
arch=${2:-$(dpkg --print-architecture)}
suite=bookworm # its python3 is 3.11, what pyproject.toml's requires-python asks for
packages=python3,python3-pip,ca-certificates
key=$(printf '%s %s %s' "$suite" "$arch" "$packages" | sha256sum | cut -c1-12)
image=localhost/ascend-agent-base:debian-$suite-$arch-$key
store=(buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs)

if "${store[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
fi

mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(ORIGIN)' 'Identifier: Packages' 2>/dev/null |
    awk -v suite="$suite" '$2 == suite && $3 == "Debian" { print $1; exit }') || true
mirror=${DEBIAN_MIRROR:-$mirror}
# No mirror known: debootstrap's own default (an empty argument list, not an empty argument).
mirror_arg=()
[[ -n $mirror ]] && mirror_arg=("$mirror")

rootfs=$root/rootfs-$arch
rm -rf "$rootfs"
echo "debian-base: debootstrap $suite ($arch) from ${mirror:-the default mirror of debootstrap}" >&2
started=$SECONDS
log=$root/debootstrap-$arch.log
timeout 3600 debootstrap --arch="$arch" --variant=minbase --include="$packages" "$suite" "$rootfs" "${mirror_arg[@]}" \
    >"$log" 2>&1 || {
    echo "debian-base: debootstrap failed; its log is $log" >&2
    tail -n 5 "$log" >&2
    exit 1
}
echo "debian-base: debootstrap ($arch) took $((SECONDS - started)) s" >&2

# What a container image leaves out: package caches, documentation, translations; /dev, /proc and /sys come
# from the runtime.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/dev/* "$rootfs"/proc/* "$rootfs"/sys/*
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"

container=$("${store[@]}" from --arch "$arch" scratch)
mount=$("${store[@]}" mount "$container")
tar --numeric-owner -C "$rootfs" -cf - . | tar --numeric-owner -xpf - -C "$mount"
"${store[@]}" umount "$container" >/dev/null
"${store[@]}" config --arch "$arch" --os linux \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label "org.opencontainers.image.description=Debian $suite with python3 and pip" \
    "$container"
"${store[@]}" commit --quiet --rm "$container" "$image" >/dev/null
rm -rf "$rootfs"
echo "$image"
