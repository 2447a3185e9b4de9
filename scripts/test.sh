#!/usr/bin/env bash
# The test command: sets up .venv with the dev extras, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest -q -n 2 -p no:cacheprovider "$@"
