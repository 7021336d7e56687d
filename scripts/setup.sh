#!/usr/bin/env bash
# One-time (idempotent) setup on a Debian machine: system packages, then the Python package.
# Installs only what is missing, so re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
# libfaketime: the clock-skew test runs a serve process with its clock skewed (tests/service)
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
# headless Chromium and its driver: the dashboard's browser tests (tests/service/test_dashboard.py)
# and scripts/screenshots.py; Selenium is pointed at /usr/bin/chromedriver, never a download
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
# the e2e tier's real node (e2e/harness/node.py) and its locally built images (e2e/images.sh):
# containerd + runc + the CNI plugins run the pods; podman builds the images on a Debian base
# that debootstrap makes (no registry is needed); catatonit is the pod sandbox ("pause") process
command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
[ -x /usr/bin/catatonit ] || need_apt+=(catatonit)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)

if ((${#need_apt[@]})); then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

echo "setup: installing the delayq Python package (editable, with dev tools)"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[dev]'
echo "setup: done"
