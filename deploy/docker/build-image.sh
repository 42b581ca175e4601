#!/bin/bash
# `make image`: build the CPU image from the Dockerfile without a docker daemon or a registry.
# buildah (Debian's package) builds with chroot isolation and vfs storage, so it needs root but
# no daemon, user namespaces or overlay mounts. The Dockerfile's default base (python:3.11-slim)
# is on Docker Hub, which need not be reachable, so the base is made here: a minimal Debian
# bookworm by debootstrap with python3 (3.11, the default base's Python) and python3-venv,
# imported as localhost/ascend-serve-base:bookworm and passed as BASE_IMAGE. pip inside the
# build reaches PyPI. Everything lands in IMAGE_DIR (default .image/, git-ignored):
#   storage/ run/          buildah's image store (vfs copies each layer whole: about 600 MB)
#   base-rootfs/           the debootstrapped base, kept so a rebuild skips debootstrap
#   oci/                   the image as an OCI layout, for run-image.sh (umoci unpacks it)
#   ascend-serve-0.1.0.tar the image as a docker archive: `docker load -i` elsewhere
# A TLS-intercepting proxy's CA (BUILD_CA_BUNDLE, else PIP_CERT if the host's pip needs one) is
# bind-mounted over the build's CA bundle for the RUN steps only; it is not in the image.
set -euo pipefail

cd "$(dirname "$0")/../.."
out=${IMAGE_DIR:-.image}
tag=${IMAGE_TAG:-ascend-serve:0.1.0}
suite=bookworm
python_version=3.11
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/ascend-serve-base:$suite
ca=${BUILD_CA_BUNDLE:-${PIP_CERT:-}}

for tool in buildah debootstrap tar jq; do
    if ! command -v "$tool" >/dev/null; then
        echo "build-image: $tool not found: apt-get install buildah debootstrap jq" >&2
        exit 2
    fi
done
if [[ $(id -u) -ne 0 ]]; then
    echo "build-image: needs root (debootstrap, and buildah's chroot isolation)" >&2
    exit 2
fi

mkdir -p "$out"
out=$(realpath "$out")
bah() {
    buildah --root "$out/storage" --runroot "$out/run" --storage-driver vfs "$@"
}

if ! bah inspect --type image "$base" >/dev/null 2>&1; then
    rootfs=$out/base-rootfs
    if [[ ! -x $rootfs/usr/bin/python3 ]]; then
        rm -rf "$rootfs"
        echo "build-image: debootstrap $suite into $rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$suite" "$rootfs" "$mirror" >"$out/debootstrap.log"
        # What Docker's slim Debian images leave out too.
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
            "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    fi
    found=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ $found != "$python_version" ]]; then
        echo "build-image: $suite has Python $found, the Dockerfile's base $python_version" >&2
        exit 1
    fi
    tar -C "$rootfs" --numeric-owner -cf "$out/base.tar" .
    container=$(bah from scratch)
    bah add "$container" "$out/base.tar" / >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 "$container"
    bah commit --rm --quiet "$container" "$base" >/dev/null
    rm "$out/base.tar"
    echo "build-image: base image $base"
fi

volumes=()
if [[ -n $ca ]]; then
    volumes=(--volume "$(realpath "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
fi
# --format docker keeps the HEALTHCHECK (OCI image configs have no field for it). No --layers:
# with vfs every cached step would be a whole copy of the filesystem (9 GB), so each build
# reruns the pip install (minutes).
bah bud --isolation chroot --format docker "${volumes[@]}" \
    --build-arg BASE_IMAGE="$base" --tag "localhost/$tag" --file Dockerfile .

archive=$out/${tag/:/-}.tar
rm -rf "$out/oci" "$archive"
bah push --quiet "localhost/$tag" "oci:$out/oci:$tag"
bah push --quiet "localhost/$tag" "docker-archive:$archive:$tag"
bah images "localhost/$tag"
manifest=$(jq -r '.manifests[0].digest | sub(":"; "/")' "$out/oci/index.json")
compressed=$(jq '[.layers[].size] | add' "$out/oci/blobs/$manifest")
echo "build-image: $tag: $(du -sh --apparent-size "$archive" | cut -f1) as a docker archive" \
    "($archive), $(numfmt --to=iec "$compressed") compressed (the OCI layout's gzipped layers)"
