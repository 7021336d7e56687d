#!/usr/bin/env bash
# Regenerate the hashed lock files the images install from (Dockerfile, e2e/images.sh,
# examples/pipeline/Dockerfile):
#   requirements/image.txt  delayq[operator,tracing]'s runtime dependencies + the build backend
#   requirements/sbom.txt   the CycloneDX SBOM generator, run in the image's build stage
#   requirements/pipeline.txt  delayq[pipeline]'s runtime dependencies (the pipeline image)
#   requirements/build.txt  the build backend alone, at image.txt's pin: the pipeline image
#                           installs it first, as pyspark ships an sdist only, built with it
# Resolved for the image's Python (3.11) on Linux, with the hash of every file PyPI has for each
# pinned version (any architecture). Run after changing pyproject.toml's dependencies or to take
# updates (`--upgrade`, or `--upgrade-package NAME`: extra arguments go to every compile);
# tests/test_packaging.py fails while the lock and pyproject.toml disagree. Needs uv (.[dev]).
set -euo pipefail
cd "$(dirname "$0")/.."
compile() {
  uv pip compile --quiet --generate-hashes --python-version 3.11 --python-platform linux \
    --custom-compile-command "scripts/lock.sh" "$@"
}
compile pyproject.toml requirements/build.in --extra operator --extra tracing -o requirements/image.txt "$@"
compile requirements/sbom.in -o requirements/sbom.txt "$@"
compile pyproject.toml --extra pipeline -o requirements/pipeline.txt "$@"
compile requirements/build.in -c requirements/image.txt -o requirements/build.txt "$@"
