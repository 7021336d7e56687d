#!/usr/bin/env bash
# The whole test suite: setup (idempotent), static checks, then every test tier with timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

tier() {
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name"
  "$@"
  echo "=== $name took $((SECONDS - start))s"
}

tier "ruff" python3 -m ruff check operator tests bench
tier "mypy --strict" python3 -m mypy
tier "tests (unit + integration)" python3 -m pytest -q -p no:cacheprovider tests "$@"
