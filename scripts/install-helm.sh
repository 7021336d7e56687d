#!/usr/bin/env bash
# Install a pinned helm into a per-user cache (idempotent): builds it from source with the Go
# toolchain through the Go module proxy, since no helm package is available here. Prints the path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
TOOLS_DIR="${DELAYQ_TOOLS_DIR:-$HOME/.cache/delayq-tools}"
BIN_DIR="$TOOLS_DIR/bin"
STAMP="$BIN_DIR/.helm-$HELM_VERSION"

if [ -x "$BIN_DIR/helm" ] && [ -f "$STAMP" ]; then
  echo "$BIN_DIR/helm"
  exit 0
fi
command -v go >/dev/null 2>&1 || { echo "install-helm: go toolchain not found" >&2; exit 1; }
mkdir -p "$BIN_DIR"
echo "install-helm: building helm $HELM_VERSION into $BIN_DIR (first run only)" >&2
GOBIN="$BIN_DIR" GOFLAGS="-mod=mod" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
rm -f "$BIN_DIR"/.helm-*
touch "$STAMP"
echo "$BIN_DIR/helm"
