#!/usr/bin/env bash
# Build kube-state-metrics from the Go module proxy into the lab's binary cache, for the tests of the
# observability pack (manifests/monitoring/kube-state-metrics; only its custom-resource-state mode).
#
#   bins/build-kube-state-metrics.sh      builds what is missing into $CLAIMWARDEN_BIN_DIR
#
# A script of its own, not part of bins/build.sh: that script's hash is in the stamps of the
# control-plane binaries, so touching it would rebuild Kubernetes (20-40 CPU minutes).
# v2.16.0 is the newest the module proxy serves here (v2.17.0 answers 403 "not available"). go.sum
# was made with GOSUMDB=off because the checksum database answers 404 for kube-state-metrics and
# k8s.io/sample-controller; the build is held to the committed go.sum (-mod=readonly).
set -euo pipefail

KSM_VERSION="2.16.0"
K8S_VERSION="${K8S_VERSION:-1.34.4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${CLAIMWARDEN_BIN_DIR:-$HOME/.cache/claimwarden/bin/v$K8S_VERSION}"
die() { echo "bins: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.24 and re-run"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
mkdir -p "$OUT"

stamp="$OUT/.kube-state-metrics.stamp"
want="$(cat "$HERE/kube-state-metrics/go.mod" "$HERE/kube-state-metrics/go.sum" "$0" | sha256sum | cut -c1-16)"
if [[ -x "$OUT/kube-state-metrics" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$OUT/kube-state-metrics" version 2>&1 | grep -q "v$KSM_VERSION"; then
  echo "bins: kube-state-metrics v$KSM_VERSION already built in $OUT"
  exit 0
fi
echo "bins: building kube-state-metrics v$KSM_VERSION into $OUT (cold: a few minutes)"
ld="-s -w"
for kv in Version=v$KSM_VERSION Revision=v$KSM_VERSION Branch=release-${KSM_VERSION%.*}; do
  ld="$ld -X github.com/prometheus/common/version.$kv"
done
(cd "$HERE/kube-state-metrics" && go build -ldflags="$ld" -o "$OUT/kube-state-metrics" k8s.io/kube-state-metrics/v2) \
  || die "building kube-state-metrics v$KSM_VERSION failed (see the go output above)"
echo "$want" > "$stamp"
"$OUT/kube-state-metrics" version 2>&1 | sed -n 1p
