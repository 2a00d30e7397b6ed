# Sourced by image/build.sh and tests/image/image-test.sh: buildah's storage for the image (vfs driver, chroot
# isolation), kept outside the clone with the bases and the layer cache, and the image's name.
cache=${ASCEND_AGENT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-agent/image}
store=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
list=localhost/ascend-agent:$version
