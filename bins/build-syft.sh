#!/usr/bin/env bash
# Build syft (the SBOM generator of `make release`) from the Go module proxy into the tool cache.
#
#   bins/build-syft.sh        prints the path of the syft binary (built once, then reused)
#
# A script of its own, like build-kube-state-metrics.sh: bins/build.sh's hash is in the control plane's
# stamps. `go install module@version` holds the build to syft's own go.sum; GOTOOLCHAIN=local keeps the
# machine's Go (a newer `go` line in syft's go.mod would otherwise fetch a toolchain, which fails here).
set -euo pipefail

SYFT_VERSION="1.57.2"
OUT="${CLAIMWARDEN_TOOLS_DIR:-$HOME/.cache/claimwarden/bin}/syft-v$SYFT_VERSION"
die() { echo "bins: $*" >&2; exit 1; }

if [[ -x "$OUT/syft" ]] && "$OUT/syft" version 2>/dev/null | grep -q "$SYFT_VERSION"; then
  echo "$OUT/syft"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.24 and re-run"
echo "bins: building syft v$SYFT_VERSION into $OUT (cold: several minutes)" >&2
mkdir -p "$OUT"
GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOBIN="$OUT" \
  go install -ldflags="-s -w -X main.version=$SYFT_VERSION" "github.com/anchore/syft/cmd/syft@v$SYFT_VERSION" >&2 \
  || die "building syft v$SYFT_VERSION failed (see the go output above)"
echo "$OUT/syft"
