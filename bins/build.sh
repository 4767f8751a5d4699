#!/usr/bin/env bash
# Build the lab's control-plane binaries from the Go module proxy into a per-version cache.
#
#   bins/build.sh            build what is missing into $CLAIMWARDEN_BIN_DIR
#                            (default ~/.cache/claimwarden/bin/v$K8S_VERSION)
#
# The wrapper modules under bins/{k8s,etcd,kwok} pin every version (go.mod + go.sum are
# committed), so a build is reproducible. A binary is rebuilt only when the stamp file next to
# it does not match the hash of its wrapper module, or the binary reports the wrong version.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.34.4}"
ETCD_VERSION="3.6.16"
KWOK_VERSION="0.8.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# One wrapper module per minor version: bins/k8s pins the default (1.34), bins/k8s-1.NN the others.
MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
if [[ "$MINOR" == 34 ]]; then K8S_MODULE=k8s; else K8S_MODULE="k8s-1.$MINOR"; fi
OUT="${CLAIMWARDEN_BIN_DIR:-$HOME/.cache/claimwarden/bin/v$K8S_VERSION}"

die() { echo "bins: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.24 (https://go.dev/dl) and re-run 'make bins'"

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
mkdir -p "$OUT"

module_hash() { cat "$HERE/$1/go.mod" "$HERE/$1/go.sum" "$HERE/build.sh" | sha256sum | cut -c1-16; }

# up_to_date <stamp-name> <module-dir> <binary> <expected substring of --version>
up_to_date() {
  local stamp="$OUT/.$1.stamp" want
  want="$(module_hash "$2")"
  [[ -x "$OUT/$3" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
  "$OUT/$3" --version 2>/dev/null | grep -q -- "$4"
}

mark_built() { module_hash "$2" > "$OUT/.$1.stamp"; }

build_k8s() {
  local minor built
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  [[ -f "$HERE/$K8S_MODULE/go.mod" ]] && grep -q "k8s.io/kubernetes v$K8S_VERSION" "$HERE/$K8S_MODULE/go.mod" \
    || die "bins/$K8S_MODULE/go.mod does not pin k8s.io/kubernetes v$K8S_VERSION (served here: 1.34.4, 1.35.4, 1.36.3, 1.37.2)"
  # The tag's commit time keeps the build date (and so the binaries) reproducible.
  built="$(cd "$HERE/$K8S_MODULE" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.load(open(d["Info"]))["Time"])')"
  local ld="-s -w -buildid="
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=$built"
  done
  echo "bins: building kube-apiserver, kube-scheduler, kube-controller-manager, kubectl v$K8S_VERSION into $OUT (cold: about 9 min on 2 cores)"
  (cd "$HERE/$K8S_MODULE" && go build -tags=selinux,notest -ldflags="$ld" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl) \
    || die "building Kubernetes v$K8S_VERSION failed (see the go output above); retry 'make bins'"
}

build_etcd() {
  echo "bins: building etcd v$ETCD_VERSION"
  (cd "$HERE/etcd" && go build -ldflags="-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3) \
    || die "building etcd v$ETCD_VERSION failed (see the go output above)"
}

build_kwok() {
  echo "bins: building kwok v$KWOK_VERSION"
  (cd "$HERE/kwok" && go build -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
    -o "$OUT/kwok" sigs.k8s.io/kwok/cmd/kwok) \
    || die "building kwok v$KWOK_VERSION failed (see the go output above)"
  # kwok needs Stage objects; the default ones ship inside its module.
  local dir
  dir="$(cd "$HERE/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$dir/kustomize/stage/$f"; echo '---'
  done > "$OUT/kwok-stages.yaml"
}

if up_to_date k8s "$K8S_MODULE" kube-apiserver "v$K8S_VERSION" && [[ -x "$OUT/kube-scheduler" && -x "$OUT/kube-controller-manager" && -x "$OUT/kubectl" ]]; then
  echo "bins: Kubernetes v$K8S_VERSION already built in $OUT"
else
  build_k8s
  "$OUT/kube-apiserver" --version | grep -q "v$K8S_VERSION" || die "kube-apiserver does not report v$K8S_VERSION"
  mark_built k8s "$K8S_MODULE"
fi
if up_to_date etcd etcd etcd "$ETCD_VERSION"; then
  echo "bins: etcd v$ETCD_VERSION already built"
else
  build_etcd; mark_built etcd etcd
fi
if up_to_date kwok kwok kwok "kwok" && [[ -s "$OUT/kwok-stages.yaml" ]]; then
  echo "bins: kwok v$KWOK_VERSION already built"
else
  build_kwok; mark_built kwok kwok
fi
echo "bins: ready in $OUT"
