#!/usr/bin/env bash
# Regenerate the hashed lock files the image installs from (Dockerfile, e2e/images.sh):
#   requirements/image.txt  delayq[operator]'s runtime dependencies + the build backend
#   requirements/sbom.txt   the CycloneDX SBOM generator, run in the image's build stage
# Resolved for the image's Python (3.11) on Linux, with the hash of every file PyPI has for each
# pinned version (any architecture). Run after changing pyproject.toml's dependencies or to take
# updates (`--upgrade`, or `--upgrade-package NAME`: extra arguments go to both compiles);
# tests/test_packaging.py fails while the lock and pyproject.toml disagree. Needs uv (.[dev]).
set -euo pipefail
cd "$(dirname "$0")/.."
compile() {
  uv pip compile --quiet --generate-hashes --python-version 3.11 --python-platform linux \
    --custom-compile-command "scripts/lock.sh" "$@"
}
compile pyproject.toml requirements/build.in --extra operator -o requirements/image.txt "$@"
compile requirements/sbom.in -o requirements/sbom.txt "$@"
