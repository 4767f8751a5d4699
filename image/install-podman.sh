#!/usr/bin/env bash
# Install podman and what builds and runs claimwarden's image without any registry, from Debian,
# and containerd for the lab's real node (claimwarden_lab/realnode.py).
#
#   image/install-podman.sh      as root, on Debian/Ubuntu; does nothing if everything is there
#
# mmdebstrap builds the base image (image/base.sh); runc replaces crun (see image/containers.conf).
set -euo pipefail
say() { echo "install-podman: $*"; }
die() { echo "install-podman: $*" >&2; exit 1; }

packages=(podman buildah skopeo runc mmdebstrap uidmap containernetworking-plugins conmon fuse-overlayfs containerd)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  say "all installed: $(podman --version)"
  exit 0
fi
[[ "$(id -u)" == 0 ]] || die "needs root for apt-get (try: sudo $0); missing: ${missing[*]}"
command -v apt-get >/dev/null 2>&1 || die "no apt-get; install ${missing[*]} by hand (or use docker: make image)"
say "apt-get update"
apt-get update -qq
say "apt-get install -y --no-install-recommends ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
podman --version
