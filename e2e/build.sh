#!/usr/bin/env bash
# Build the e2e control plane from the official Go modules, pinned and cached:
#   kube-apiserver, kube-controller-manager, kube-scheduler, etcd  (wrapper module e2e/kube-build)
#   kubelet, kube-proxy (the real node of the real-pods tier)      (same wrapper module)
#   kwok                                                           (go install @KWOK_VERSION)
#   coredns (the cluster DNS of the real node)                     (go install @COREDNS_VERSION)
#   helm                                                           (scripts/install-helm.sh)
# There is no Docker engine and no release-download access here, only the Go module proxy, so
# everything is compiled locally. Binaries land in ~/.cache/delayq-e2e/<k8s-version>/bin and are
# reused when the stamp (a hash of the pins and BUILD_REV) matches, so only the first run is slow.
# Prints the bin directory on stdout as its last line; progress and timings go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MOD_DIR="$ROOT/e2e/kube-build"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"

log() { echo "e2e/build: [$(date -u +%H:%M:%S)] $*" >&2; }

K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$MOD_DIR/go.mod")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$MOD_DIR/go.mod")
[ -n "$K8S_VERSION" ] && [ -n "$ETCD_VERSION" ] || { log "cannot read pins from $MOD_DIR/go.mod"; exit 1; }

CACHE_ROOT="${DELAYQ_E2E_CACHE:-$HOME/.cache/delayq-e2e}"
BIN_DIR="$CACHE_ROOT/$K8S_VERSION/bin"
STAMP="$BIN_DIR/.stamp"
BUILD_REV=2  # bump when the recipe below changes in a way that needs new binaries
WANT_STAMP=$(cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" <(echo "kwok=$KWOK_VERSION coredns=$COREDNS_VERSION rev=$BUILD_REV") \
  | sha256sum | cut -d' ' -f1)
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubelet kube-proxy coredns)

have_all() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ]
}

kubectl_ok() {
  # A kubectl on PATH is used when it is within the supported one-minor skew of the apiserver;
  # otherwise the pinned one is built into the cache (same wrapper module, so no extra downloads).
  [ -x "$BIN_DIR/kubectl" ] && return 0
  command -v kubectl >/dev/null 2>&1 || return 1
  local minor
  minor=$(kubectl version --client -o json 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["minor"].rstrip("+"))') \
    || return 1
  [ "$minor" -ge $((MINOR - 1)) ] && [ "$minor" -le $((MINOR + 1)) ]
}

build_kubectl() {
  (cd "$MOD_DIR" && GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 \
    go build -trimpath -ldflags "$LDFLAGS" -o "$BIN_DIR/kubectl" k8s.io/kubernetes/cmd/kubectl) >&2
}

link_helm() {
  # helm comes from the project's own installer (shared with the chart tooling), linked here so
  # the e2e fixtures find every tool in one directory.
  local helm
  helm=$(bash "$ROOT/scripts/install-helm.sh" | tail -n1)
  ln -sf "$helm" "$BIN_DIR/helm"
}

MAJOR=${K8S_VERSION#v}; MAJOR=${MAJOR%%.*}
MINOR=${K8S_VERSION#v*.}; MINOR=${MINOR%%.*}
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$MAJOR -X $pkg.gitMinor=$MINOR"
  LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
done
LDFLAGS+=" -s -w"

TOTAL_START=$SECONDS
if have_all; then
  log "cache hit: $BIN_DIR (kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION," \
    "coredns $COREDNS_VERSION)"
  [ -x "$BIN_DIR/helm" ] || link_helm
  kubectl_ok || { log "no usable kubectl on PATH: building one"; build_kubectl; }
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go toolchain not found (need Go >= 1.24)"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"
mkdir -p "$BIN_DIR"
rm -f "$STAMP"
log "cold build into $BIN_DIR with $(go version | cut -d' ' -f3) (first run only; ~20-40 min on 2 cores)"

step() {
  local name=$1; shift
  local start=$SECONDS
  log "$name ..."
  "$@" >&2
  log "$name took $((SECONDS - start))s"
}


step "download modules for kubernetes $K8S_VERSION + etcd $ETCD_VERSION" \
  bash -c "cd '$MOD_DIR' && nice -n 10 go mod download"
step "build kube-apiserver kube-controller-manager kube-scheduler $K8S_VERSION" \
  bash -c "cd '$MOD_DIR' && nice -n 10 go build -trimpath -ldflags '$LDFLAGS' -o '$BIN_DIR/' \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler"
step "build kubelet kube-proxy $K8S_VERSION" \
  bash -c "cd '$MOD_DIR' && nice -n 10 go build -trimpath -ldflags '$LDFLAGS' -o '$BIN_DIR/' \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy"
step "build etcd $ETCD_VERSION" \
  bash -c "cd '$MOD_DIR' && nice -n 10 go build -trimpath -ldflags '-s -w' -o '$BIN_DIR/etcd' \
    go.etcd.io/etcd/server/v3"
# kwok's go.mod has no replace directives, so a plain pinned `go install` works (checksum-verified);
# `go install pkg@version` refuses -mod flags, hence the GOFLAGS override.
step "build kwok $KWOK_VERSION" \
  env GOBIN="$BIN_DIR" GOFLAGS=-buildvcs=false nice -n 10 go install -trimpath -ldflags '-s -w' \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
# CoreDNS likewise (static: it runs FROM scratch in the cluster DNS image, e2e/images.sh).
step "build coredns $COREDNS_VERSION" \
  env GOBIN="$BIN_DIR" GOFLAGS=-buildvcs=false CGO_ENABLED=0 nice -n 10 go install -trimpath \
    -ldflags '-s -w' "github.com/coredns/coredns@$COREDNS_VERSION"
kubectl_ok || step "build kubectl $K8S_VERSION (none usable on PATH)" build_kubectl
step "helm" link_helm

"$BIN_DIR/kube-apiserver" --version >&2
# sed reads all of it: `head -n1` may exit first, and etcd's SIGPIPE fails the script (pipefail)
# before the stamp is written, so every later run would build everything again
"$BIN_DIR/etcd" --version | sed -n 1p >&2
"$BIN_DIR/kwok" --version >&2 || true
echo "$WANT_STAMP" > "$STAMP"
log "cold build took $((SECONDS - TOTAL_START))s"
echo "$BIN_DIR"
