#!/usr/bin/env bash
# Make a local stand-in for python:3.11-slim, for machines that reach Debian's archive but no
# container registry (CI here): Debian's Python 3.11 debootstrapped (minbase) and imported into
# buildah's storage as localhost/python-standin:3.11. Build the Dockerfile on it with
#   buildah build --build-arg PYTHON_IMAGE=localhost/python-standin:3.11 ...
# It is not the official base (Debian's /usr/bin/python3.11, not /usr/local/bin; Debian's pip and
# patches) and is never pushed; it exists so the image can be built and run where the official one
# cannot be pulled. Idempotent: the image in buildah's storage is reused, else the OCI archive
# cached in ${XDG_CACHE_HOME:-~/.cache}/volcano-job-webhook/images/, else it is made (a few minutes).
# Needs root, buildah and debootstrap, on Debian or a derivative. Prints the image's name.
set -euo pipefail

name="${STANDIN_IMAGE:-localhost/python-standin:3.11}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/volcano-job-webhook/images"
archive="$cache/python-standin-3.11.oci.tar"

if buildah inspect --type image "$name" >/dev/null 2>&1; then
  echo "$name"
  exit 0
fi
if [ -s "$archive" ]; then
  if id="$(buildah pull -q "oci-archive:$archive")" && buildah tag "$id" "$name"; then
    echo "$name"
    exit 0
  fi
  echo "standin-base.sh: $archive does not load; making the image again" >&2
  rm -f "$archive"
fi

for tool in buildah debootstrap apt-get; do
  command -v "$tool" >/dev/null || { echo "standin-base.sh: $tool is not installed" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "standin-base.sh: debootstrap needs root" >&2; exit 1; }

# This machine's release and its configured archive, read now: no mirror is written down here.
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:?}")"
mirror="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' \
          | awk -v release="$codename" '$2 == release { print $1; exit }')"
[ -n "$mirror" ] || { echo "standin-base.sh: no apt source for $codename in this machine's apt configuration" >&2; exit 1; }

work="$(mktemp -d)"
container=""
cleanup() {
  [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# passwd: the Dockerfile's groupadd/useradd; python3-venv and python3-pip: its build stage.
debootstrap --variant=minbase \
  --include=python3.11,python3-venv,python3-pip,python-is-python3,passwd,ca-certificates \
  "$codename" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; echo "standin-base.sh: debootstrap failed" >&2; exit 1; }

rootfs="$work/rootfs"
# What a container runtime provides at run time, and what only served debootstrap, stays out.
rm -rf "$rootfs"/dev/* "$rootfs"/proc/* "$rootfs"/sys/* "$rootfs"/run/* "$rootfs"/tmp/* \
       "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
       "$rootfs"/var/log/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
# pip inside the build must reach the package index the way this machine does (its CA bundle and
# its pip settings).
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$rootfs/etc/pip.conf"; fi

container="$(buildah from scratch)"
mount="$(buildah mount "$container")"
cp -a "$rootfs/." "$mount/"
buildah umount "$container" >/dev/null
buildah config \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 \
  --cmd python3 \
  --label org.opencontainers.image.title=python-standin \
  --label org.opencontainers.image.description="Debian's Python 3.11 ($codename, minbase): a local stand-in for python:3.11-slim" \
  "$container"
buildah commit -q --rm "$container" "$name" >/dev/null
container=""

mkdir -p "$cache"
buildah push -q "$name" "oci-archive:$archive.partial" >/dev/null
mv "$archive.partial" "$archive"
echo "$name"
