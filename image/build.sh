#!/usr/bin/env bash
# Build claimwarden's image and write it as an OCI archive: dist/claimwarden-<version>.oci.tar.
#
#   image/build.sh                      docker if it runs, else podman (installed from Debian if missing)
#   ENGINE=podman BASE=python:3.11-slim image/build.sh     podman with a registry
#   IMAGE=registry.example/claimwarden:1.2.0 image/build.sh
#   REVISION=<commit> image/build.sh                       the image's org.opencontainers.image.revision label
#   ARCH=arm64 image/build.sh            another architecture through qemu user emulation (podman only):
#                                        claimwarden:<version>-arm64, dist/claimwarden-<version>-linux-arm64.oci.tar
#
# Without a registry (this project's CI machine) podman builds FROM a local Debian bookworm base made
# by mmdebstrap (image/base.sh, cached in podman's storage), with --pull=never. pip inside the build
# uses the host's CA bundle and pip configuration, bind-mounted read-only: they are not in any layer.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "image: $*"; }
die() { echo "image: $*" >&2; exit 1; }

# The one version source (release/build.py stamps it in the copy it builds from).
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' operator/claimwarden/__init__.py)"
[[ -n "$VERSION" ]] || die "no __version__ in operator/claimwarden/__init__.py"
REVISION="${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
labels=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION")
HOST_ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
ARCH="${ARCH:-$HOST_ARCH}"
if [[ "$ARCH" == "$HOST_ARCH" ]]; then
  IMAGE="${IMAGE:-claimwarden:$VERSION}"
  ARCHIVE="${ARCHIVE:-dist/claimwarden-$VERSION.oci.tar}"
  LOCAL_BASE=localhost/claimwarden-base:bookworm
  platform=()
else
  IMAGE="${IMAGE:-claimwarden:$VERSION-$ARCH}"
  ARCHIVE="${ARCHIVE:-dist/claimwarden-$VERSION-linux-$ARCH.oci.tar}"
  LOCAL_BASE="localhost/claimwarden-base:bookworm-$ARCH"
  platform=(--platform "linux/$ARCH")
  [[ "${ENGINE:-podman}" == podman ]] || die "ARCH=$ARCH: podman only"
  ENGINE=podman
  image/install-emulation.sh "$ARCH"
fi

if [[ -z "${ENGINE:-}" ]]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
  else ENGINE=podman
  fi
fi
case "$ENGINE" in
  docker)
    BASE="${BASE:-python:3.11-slim}"
    say "docker build (BASE=$BASE) -t $IMAGE"
    docker build --build-arg "BASE=$BASE" "${labels[@]}" -t "$IMAGE" .
    mkdir -p "$(dirname "$ARCHIVE")"
    docker save -o "$ARCHIVE" "$IMAGE"  # Docker 25+ writes an OCI image layout
    ;;
  podman)
    image/install-podman.sh
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/image/containers.conf}"
    pull=missing
    if [[ -z "${BASE:-}" ]]; then
      BASE="$LOCAL_BASE"
      ARCH="$ARCH" image/base.sh "$BASE"
      pull=never
    fi
    mounts=()
    for f in /etc/pip.conf "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"; do
      [[ -f "$f" ]] && mounts+=(-v "$f:$f:ro")
    done
    previous="$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
    say "podman build --pull=$pull (BASE=$BASE) -t $IMAGE"
    podman build "${platform[@]}" --pull="$pull" --network=host --build-arg "BASE=$BASE" "${labels[@]}" "${mounts[@]}" -t "$IMAGE" .
    # The image it replaces would stay behind, untagged (about 170 MB of its own each build).
    if [[ -n "$previous" && "$previous" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
      podman rmi "$previous" >/dev/null 2>&1 || true
    fi
    mkdir -p "$(dirname "$ARCHIVE")"
    rm -f "$ARCHIVE"
    podman save --format oci-archive -o "$ARCHIVE" "$IMAGE"
    ;;
  *) die "ENGINE=$ENGINE: docker or podman" ;;
esac
say "$IMAGE: $(du -m "$ARCHIVE" | cut -f1) MB archive at $ARCHIVE"
