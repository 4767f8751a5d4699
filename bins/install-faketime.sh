#!/usr/bin/env bash
# Install Debian's faketime (libfaketime and its wrapper) for the chaos suite's clock-rate skew scenario
# (tests/chaos: one claimwarden replica runs with its clocks 10 % fast).
#
#   bins/install-faketime.sh     as root, on Debian/Ubuntu; does nothing if faketime is installed
set -euo pipefail

say() { echo "install-faketime: $*"; }
die() { echo "install-faketime: $*" >&2; exit 1; }

if command -v faketime >/dev/null 2>&1; then
  say "$(command -v faketime) already installed; nothing to do"
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root for apt-get (try: sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "no apt-get; install libfaketime and its faketime wrapper by hand"

say "apt-get update"
apt-get update -qq
say "apt-get install -y --no-install-recommends faketime"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime

command -v faketime >/dev/null 2>&1 || die "the package did not install the faketime command"
say "installed $(command -v faketime)"
