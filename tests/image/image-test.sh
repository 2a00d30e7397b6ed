#!/usr/bin/env bash
# make image-test: `make image` (image/build.sh: linux/amd64 and linux/arm64 with buildah, no daemon), then
# inside each architecture's image (buildah run; arm64 under emulation, qemu-user-static through
# binfmt_misc): `ascend-agent version`, `ascend-agent list --backend fake`, and the agent against the kubelet
# simulator until registered (tests/image/in-image.sh), with the seconds from its start to the registration.
# Runs as root. An architecture the kernel cannot run is reported with the tool's own refusal, and the
# others are still tested.
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "image-test: $*"; }
die() {
    echo "image-test: $*" >&2
    exit 1
}
took() { say "$1 took $((SECONDS - $2)) s"; }

[ "$(id -u)" -eq 0 ] || die "needs root (buildah builds and runs images as root here); run it with sudo"
started=$SECONDS
image/build.sh >/dev/null || die "make image failed (above)"
took "make image" "$started"
source image/store.sh
# The images tested are the ones just built: no other build tags them meanwhile.
exec 9>"$cache/.lock"
flock 9

expected="ascend-agent $version"
tested=0
for arch in amd64 arm64; do
    image=$list-$arch
    if ! "${store[@]}" inspect --type image "$image" >/dev/null 2>&1; then
        say "linux/$arch: not built (image/build.sh said why above)"
        continue
    fi
    step=$SECONDS
    container=$("${store[@]}" from --pull-never --arch "$arch" "$image")
    trap '"${store[@]}" rm "$container" >/dev/null' EXIT
    # Emulated, an interpreter starts several times slower: the in-image waits get that much longer.
    slower=1
    [ "$arch" = "$(dpkg --print-architecture)" ] || slower=6
    in_image() { timeout $((120 * slower)) "${store[@]}" run "$@"; }

    got=$(in_image "$container" -- ascend-agent version) || die "linux/$arch: ascend-agent version failed (above)"
    [ "$got" = "$expected" ] || die "linux/$arch: ascend-agent version printed '$got', expected '$expected'"
    say "linux/$arch: $got, $("${store[@]}" images --format '{{.Size}}' "$image") uncompressed"

    listing=$(in_image "$container" -- ascend-agent list --backend fake) ||
        die "linux/$arch: ascend-agent list --backend fake failed (above)"
    rows=$(grep -cE '^Ascend910-[0-7] +910B4 +Healthy' <<<"$listing") || true
    [ "$rows" -eq 8 ] || die "linux/$arch: ascend-agent list --backend fake showed $rows of 8 Healthy chips"

    in_image --env "AWAIT_SECONDS=$((30 * slower))" --volume "$PWD/tests/image:/image-test:ro" "$container" -- \
        sh /image-test/in-image.sh | sed "s|^in-image:|image-test: linux/$arch:|" ||
        die "linux/$arch: the agent and the kubelet simulator failed inside the image (above)"
    "${store[@]}" rm "$container" >/dev/null
    trap - EXIT
    took "linux/$arch" "$step"
    tested=$((tested + 1))
done
[ "$tested" -gt 0 ] || die "no architecture's image to test"
took "make image-test" "$started"
