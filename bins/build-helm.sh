#!/usr/bin/env bash
# Build helm from the Go module proxy into the lab's binary cache, for the chart tests (charts/claimwarden).
#
#   bins/build-helm.sh      builds helm into ~/.cache/claimwarden/bin/helm-v<version>/helm unless it is there
#
# A script and a wrapper module of its own (bins/helm), like kube-state-metrics', so that the stamps of
# bins/build.sh's binaries stay valid. helm does not depend on the lab's Kubernetes version, hence one
# directory for every K8S_VERSION. The ldflags are those of helm's own Makefile: the version, and the
# Kubernetes version that `helm template` and `helm lint` assume (client-go v0.37 -> 1.37, as helm derives it).
set -euo pipefail

HELM_VERSION="3.22.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${CLAIMWARDEN_HELM_DIR:-$HOME/.cache/claimwarden/bin/helm-v$HELM_VERSION}"
die() { echo "bins: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.24 and re-run"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
grep -q "helm.sh/helm/v3 v$HELM_VERSION" "$HERE/helm/go.mod" || die "bins/helm/go.mod does not pin helm v$HELM_VERSION"

stamp="$OUT/.helm.stamp"
want="$(cat "$HERE/helm/go.mod" "$HERE/helm/go.sum" "$0" | sha256sum | cut -c1-16)"
if [[ -x "$OUT/helm" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$OUT/helm" version --short 2>/dev/null | grep -q "v$HELM_VERSION"; then
  echo "bins: helm v$HELM_VERSION already built in $OUT"
  exit 0
fi
client_go="$(cd "$HERE/helm" && go list -m -f '{{.Version}}' k8s.io/client-go)"   # v0.37.0
k8s_minor="$(echo "$client_go" | cut -d. -f2)"
ld="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
done
echo "bins: building helm v$HELM_VERSION into $OUT (cold: a few minutes)"
mkdir -p "$OUT"
(cd "$HERE/helm" && go build -ldflags="$ld" -o "$OUT/helm" helm.sh/helm/v3/cmd/helm) \
  || die "building helm v$HELM_VERSION failed (see the go output above)"
echo "$want" > "$stamp"
"$OUT/helm" version --short
