#!/usr/bin/env bash
# make image-test: build the node image from the Containerfile with buildah and run it, with no container
# engine daemon. Runs as root; installs buildah and debootstrap with apt-get when they are missing.
#
#   1. the base: the Containerfile's default (BASE_IMAGE=<image> to choose another), pulled; when it cannot
#      be pulled, a Debian bookworm base made by debootstrap (tests/image/debian-base.sh) takes its place;
#   2. the image, built with --layers (an unchanged tree builds from the cache);
#   3. inside it (buildah run): `ascend-agent version`, `ascend-agent list --backend fake`, and the agent
#      against the kubelet simulator (tests/image/in-image.sh).
#
# Everything stays under build/image/: buildah's storage (vfs driver, chroot isolation) with the base, the
# layer cache and the image, so a second run reuses them and `make clean` removes them.
set -euo pipefail
cd "$(dirname "$0")/../.."

work=$PWD/build/image
image=localhost/ascend-agent:image-test
store=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
started=$SECONDS

say() { echo "image-test: $*"; }
die() {
    echo "image-test: $*" >&2
    exit 1
}
took() { say "$1 took $((SECONDS - $2)) s"; }

[ "$(id -u)" -eq 0 ] || die "needs root (buildah builds and runs images as root here); run it with sudo"

missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "needs ${missing[*]}; install them with the system's package manager"
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$work"

default_base=$(sed -n 's/^ARG BASE_IMAGE=//p' Containerfile)
[ -n "$default_base" ] || die "Containerfile declares no ARG BASE_IMAGE=<default>"
base=${BASE_IMAGE:-$default_base}
if "${store[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    say "base $base (in the cache)"
elif timeout 300 "${store[@]}" pull --quiet "$base" >/dev/null 2>"$work/pull.log"; then
    say "base $base (pulled)"
else
    say "cannot pull $base (why: $work/pull.log); using a Debian base made by debootstrap"
    step=$SECONDS
    base=$(tests/image/debian-base.sh "$work")
    took "base $base" "$step"
fi

# pip in the build trusts what this host trusts (a TLS-inspecting proxy, a private index's CA): the host's
# CA bundle is mounted over the base's during the RUN steps only, never copied into the image.
mounts=()
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] && mounts+=(--volume "$ca:$ca:ro")

step=$SECONDS
"${store[@]}" build --layers --build-arg "BASE_IMAGE=$base" "${mounts[@]}" \
    -f Containerfile -t "$image" . >"$work/build.log" 2>&1 || {
    tail -n 20 "$work/build.log" >&2
    die "buildah build failed; the whole log is $work/build.log"
}
took "build of $image" "$step"

# With vfs every layer is a full copy of the tree (150-250 MB here), so the layers of earlier builds go: only
# this build's steps (the cache for the next run) and the bases stay.
keep=$(grep -oE '^--> (Using cache )?[0-9a-f]{11,}' "$work/build.log" | grep -oE '[0-9a-f]{11}' | sort -u) || true
for id in $("${store[@]}" images --all --format '{{.ID}} {{.Name}}' | awk '$2 == "<none>" { print $1 }'); do
    grep -qx "${id:0:11}" <<<"$keep" || "${store[@]}" rmi "$id" >/dev/null 2>&1 || true
done
size=$("${store[@]}" images --format '{{.Size}}' "$image")
say "image size $size (uncompressed, as stored)"

container=$("${store[@]}" from --pull-never "$image")
trap '"${store[@]}" rm "$container" >/dev/null' EXIT
in_image() { timeout 120 "${store[@]}" run "$@"; }

expected="ascend-agent $(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
got=$(in_image "$container" -- ascend-agent version)
[ "$got" = "$expected" ] || die "ascend-agent version printed '$got', expected '$expected'"
say "$got"

listing=$(in_image "$container" -- ascend-agent list --backend fake)
echo "$listing"
rows=$(grep -cE '^Ascend910-[0-7] +910B4 +Healthy' <<<"$listing") || true
[ "$rows" -eq 8 ] || die "ascend-agent list --backend fake showed $rows of 8 Healthy chips"

in_image --volume "$PWD/tests/image:/image-test:ro" "$container" -- sh /image-test/in-image.sh ||
    die "the agent and the kubelet simulator failed inside the image (above)"
took "make image-test" "$started"
