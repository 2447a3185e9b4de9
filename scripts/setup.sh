#!/usr/bin/env bash
# Creates .venv and installs ftw into it (editable). Usage: scripts/setup.sh [dev]
# Re-runs are cheap: a stamp keyed by pyproject.toml skips an install that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.ftw-installed-${extra:-base}-$(cksum < pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # pin the CPU build first: the package's own range would otherwise pull a CUDA build
  .venv/bin/python -m pip install -q "torch==2.13.0"
  if [ -n "$extra" ]; then
    .venv/bin/python -m pip install -q -e ".[$extra]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi
