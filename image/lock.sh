#!/usr/bin/env bash
# Regenerate requirements.lock: claimwarden's runtime dependencies (pyproject.toml), pinned, with the
# sha256 of every file PyPI serves for each pin (the Dockerfile installs them with --require-hashes).
#
#   image/lock.sh          after changing [project].dependencies in pyproject.toml
#
# pip-tools runs in a throw-away venv; the lock is for Python 3.11 (the image's Python).
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${TMPDIR:-/tmp}/claimwarden-pip-tools"
[[ -x "$tools/bin/pip-compile" ]] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet 'pip-tools~=7.6'; }
# Only the index: no local find-links directory may decide what is pinned.
env -u PIP_FIND_LINKS "$tools/bin/pip-compile" --quiet --generate-hashes --strip-extras --allow-unsafe \
  --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
  --output-file requirements.lock pyproject.toml
echo "wrote requirements.lock ($(grep -c '==' requirements.lock) pins)"
