#!/usr/bin/env bash
# Build the kubelet of the lab's Kubernetes version for `claimwarden lab up --real-node` into the
# lab's binary cache. Its own wrapper module (bins/kubelet: bins/k8s plus the two modules only the
# kubelet imports, at the versions k8s.io/kubernetes pins) and its own script, so that the stamps of
# bins/build.sh's binaries stay valid. Costs CPU minutes; nothing else needs it.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.34.4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${CLAIMWARDEN_BIN_DIR:-$HOME/.cache/claimwarden/bin/v$K8S_VERSION}"
die() { echo "bins: $*" >&2; exit 1; }
command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
grep -q "k8s.io/kubernetes v$K8S_VERSION" "$HERE/kubelet/go.mod" || die "bins/kubelet/go.mod does not pin v$K8S_VERSION"

stamp="$OUT/.kubelet.stamp"
want="$(cat "$HERE/kubelet/go.mod" "$HERE/kubelet/go.sum" "$0" | sha256sum | cut -c1-16)"
if [[ -x "$OUT/kubelet" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$OUT/kubelet" --version 2>/dev/null | grep -q "v$K8S_VERSION"; then
  echo "bins: kubelet v$K8S_VERSION already built in $OUT"
  exit 0
fi
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
ld="-s -w -buildid="
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
echo "bins: building kubelet v$K8S_VERSION into $OUT"
mkdir -p "$OUT"
(cd "$HERE/kubelet" && go build -tags=selinux,notest -ldflags="$ld" -o "$OUT/kubelet" k8s.io/kubernetes/cmd/kubelet) \
  || die "building the kubelet failed (see the go output above)"
echo "$want" > "$stamp"
"$OUT/kubelet" --version
