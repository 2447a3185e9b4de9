#!/usr/bin/env bash
# Creates .venv and installs ftw into it (editable; the C++ runtime is compiled by the install).
# Usage: scripts/setup.sh [dev]
# Re-runs are cheap: a stamp keyed by pyproject.toml, CMakeLists.txt and every file under csrc/
# skips an install that is already done, and a C++ change re-installs (recompiling only what
# changed: the build folder is build/<wheel tag>). Python edits are live without a re-install.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip)
# one install at a time: several test runs may start together on a shared tree
exec 9>.venv/.ftw-setup.lock
flock 9
csrc_files=$(find csrc -type f -not -name '*.pyc' | LC_ALL=C sort)
# names too: a renamed or deleted file changes what CMake globs
key=$( { cat pyproject.toml CMakeLists.txt; echo "$csrc_files"; echo "$csrc_files" | xargs -r cat; } | cksum | cut -d' ' -f1)
stamp=".venv/.ftw-installed-${extra:-base}-$key"
if [ ! -f "$stamp" ]; then
  "${pip[@]}" install -q --upgrade pip
  # pin the CPU build first: the package's own range would otherwise pull a CUDA build
  "${pip[@]}" install -q "torch==2.13.0"
  # the build runs in .venv itself (no isolated build env), so a rebuild reuses build/ and
  # needs the build requirements here: pyproject.toml's [build-system] requires, and CMake +
  # ninja where the machine has none recent enough
  build_reqs=("scikit-build-core>=0.10" "nanobind>=2.0" "gguf>=0.17")
  if ! cmake --version 2>/dev/null | awk 'NR==1 {split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 18))}'; then
    build_reqs+=("cmake>=3.18")
  fi
  command -v ninja >/dev/null || build_reqs+=("ninja")
  "${pip[@]}" install -q "${build_reqs[@]}"
  # the distribution was called `ftw` before it was `ftw-moe`: drop that install (same import name)
  if "${pip[@]}" show -q ftw >/dev/null 2>&1; then "${pip[@]}" uninstall -q -y ftw; fi
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  "${pip[@]}" install -q --no-build-isolation -e ".${extra:+[$extra]}"
  rm -f .venv/.ftw-installed-*
  touch "$stamp"
fi
