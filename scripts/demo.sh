#!/usr/bin/env bash
# The main job on the bundled samples: convert, inspect, check. Sets up .venv by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ftw=.venv/bin/ftw
mkdir -p out
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

# a real-world mix: bf16 first and last MoE layers, NVFP4 (ModelOpt) in between
step $ftw convert samples/st/mixed_bf16_nvfp4 out/mixed_bf16_nvfp4.ftw --force
step $ftw inspect out/mixed_bf16_nvfp4.ftw
step $ftw check samples/st/mixed_bf16_nvfp4 out/mixed_bf16_nvfp4.ftw --runtime cpu

# a Q4_K_M GGUF: Q6_K down projections on some layers, Q4_K elsewhere
step $ftw convert samples/gguf/qwen3moe-Q4_K_M.gguf out/qwen3moe-Q4_K_M.ftw --force
step $ftw inspect out/qwen3moe-Q4_K_M.ftw
step $ftw check samples/gguf/qwen3moe-Q4_K_M.gguf out/qwen3moe-Q4_K_M.ftw --runtime cpu

# and every other sample, ending with one summary table
step .venv/bin/python scripts/demo.py
