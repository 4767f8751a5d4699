#!/usr/bin/env bash
# Let this amd64 host build images of another architecture (arm64: GB200/GH200 nodes) through qemu user
# emulation: Debian's qemu-user-static registers its interpreters with binfmt_misc ("F": loaded once, so
# they also work inside build containers), arch-test is what mmdebstrap asks before a foreign bootstrap.
#
#   image/install-emulation.sh arm64     as root; does nothing if arm64 binaries already run
#
# binfmt_misc is mounted if it is not (a container may refuse: then the refusal is printed as it is).
set -euo pipefail
ARCH="${1:?usage: image/install-emulation.sh <debian architecture, e.g. arm64>}"
say() { echo "emulation: $*"; }
die() { echo "emulation: $*" >&2; exit 1; }

if command -v arch-test >/dev/null 2>&1 && arch-test "$ARCH" >/dev/null 2>&1; then
  say "$ARCH binaries run here"
  exit 0
fi
[[ "$(id -u)" == 0 ]] || die "needs root (apt-get, binfmt_misc); try: sudo $0 $ARCH"
missing=()
for p in arch-test qemu-user-static binfmt-support; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
  say "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
update-binfmts --enable >/dev/null 2>&1 || true  # binfmt-support registers what qemu-user-static ships
arch-test "$ARCH" || die "$ARCH binaries still do not run here (arch-test above): no arm64 image on this host"
