#!/usr/bin/env bash
# Build the local base image (Debian bookworm with Python 3.11 and CA certificates) with mmdebstrap
# and import it into podman as $BASE, where no registry is reachable. Built once, then reused.
#
#   image/base.sh [BASE]                 default localhost/claimwarden-base:bookworm
#   ARCH=arm64 image/base.sh [BASE]      another architecture (qemu user emulation: image/install-emulation.sh)
set -euo pipefail
BASE="${1:-localhost/claimwarden-base:bookworm}"
ARCH="${ARCH:-$(dpkg --print-architecture)}"
say() { echo "base: $*"; }
export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}"

if podman image exists "$BASE"; then
  say "$BASE exists; not rebuilt (podman rmi $BASE to rebuild)"
  exit 0
fi
tarball="$(mktemp --suffix=.tar)"
trap 'rm -f "$tarball"' EXIT
say "mmdebstrap bookworm $ARCH (minbase + python3, python3-venv, python-is-python3, ca-certificates)"
# The host's mirror configuration is used as is (sources from /etc/apt); no apt lists or caches stay.
mmdebstrap --quiet --variant=minbase --mode=root --format=tar --architectures="$ARCH" \
  --include=python3,python3-venv,python-is-python3,ca-certificates \
  --aptopt='Acquire::Retries "3"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$tarball"
podman import --arch "$ARCH" --change 'CMD ["/bin/bash"]' "$tarball" "$BASE" >/dev/null
say "imported $BASE ($(podman image inspect --format '{{.Size}}' "$BASE") bytes)"
