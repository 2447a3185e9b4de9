#!/usr/bin/env bash
# On a GPU machine: convert bundled samples and run the CUDA round trip (ftw check --runtime
# cuda): pinned banks -> per-format slot pools -> each layer's kernel -> compared with a float64
# MoE from the source's own tensors and with the CPU executor.
#   bash scripts/gpu_demo.sh                      # the real-world mix: bf16 first/last, NVFP4 between
#   bash scripts/gpu_demo.sh st/mixed_fp8_nvfp4 gguf/qwen3moe-Q4_K_M.gguf ...   # any samples
# ftw must be installed with CUDA (scripts/setup.sh where nvcc is; offline, docs/ARCHITECTURE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# the installed command: run from the source tree, `python -m ftw.cli` would import the
# uncompiled source package instead of the installed one with ftw._runtime
if [ -x .venv/bin/ftw ]; then ftw=.venv/bin/ftw; else ftw=$(command -v ftw); fi
out=${OUT_DIR:-out}
mkdir -p "$out"
status=0
for s in "${@:-st/mixed_bf16_nvfp4}"; do
  name=$(basename "$s" .gguf)
  printf '\n\033[1m$ ftw convert samples/%s %s/%s.ftw && ftw check ... --runtime cuda\033[0m\n' "$s" "$out" "$name"
  "$ftw" convert "samples/$s" "$out/$name.ftw" --force >/dev/null
  "$ftw" check "samples/$s" "$out/$name.ftw" --runtime cuda ${CHECK_ARGS:-} || status=1
done
exit $status
