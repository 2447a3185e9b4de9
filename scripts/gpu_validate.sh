#!/usr/bin/env bash
# On a GPU machine (the lent H200): the whole validation a change to the CUDA kernels needs before
# it is called done, in one run: build, every GPU test, the CUDA checks, the demo (`ftw check
# --runtime cuda` on every bundled sample), the decode bench at both sizes, and compute-sanitizer
# on the tests that SANITIZE_K selects. Logs and the bench's JSON go under $OUT (default out/gpu).
#   bash scripts/gpu_validate.sh
#   VARIANTS_GGUF_A=lanes6-0 SANITIZE_K="test_lane_blocks16_body and types0" bash scripts/gpu_validate.sh
#   CASES=1,8same,8indep bash scripts/gpu_validate.sh     # also T = 8 with independent routings
# Variants (bench/bench_kernels.py VARIANTS) are timed beside the defaults in interleaved rounds:
# VARIANTS_ST (safetensors formats), VARIANTS_GGUF_A (K-quants, Q8_0), VARIANTS_GGUF_B (the rest).
# Assumes the build's Python packages are there (on the H200: gguf and zstandard as wheels, then
# `pip install --no-build-isolation --no-deps --no-index`; docs/BENCHMARKS.md's runs say how).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu}
mkdir -p "$out"
t0=$(date +%s)
elapsed() { echo "$1 after $(( $(date +%s) - t0 )) s"; }
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > "$out/build.log" 2>&1 \
  || { tail -50 "$out/build.log"; exit 1; }
elapsed build
status=0
python3 -m pytest -q -p no:cacheprovider --durations=25 -n "${PYTEST_WORKERS:-16}" -m gpu tests/test_cuda_kernels.py \
  tests/test_cuda_kernels_gguf.py tests/test_cuda_register_shapes.py tests/test_cuda_staged.py tests/test_loader_gpu.py \
  tests/test_pools_gpu.py tests/test_cuda_early_weights.py tests/test_cuda_pdl0.py > "$out/gpu_suite.log" 2>&1 || status=1
tail -15 "$out/gpu_suite.log"
python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda_checks.py 2>&1 | tail -3 || status=1
python3 scripts/demo.py --runtime cuda > "$out/demo.log" 2>&1 || status=1
tail -4 "$out/demo.log"
elapsed tests
bench() {  # name, formats, variants
  python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases "${CASES:-1,8same}" \
    --formats "$2" ${3:+--variants "$3"} --json "$out/bench_$1.json" >> "$out/bench.log" 2>&1 || status=1
}
bench st bf16,fp8_block,nvfp4,mxfp4,ds_fp4,mxfp8 "${VARIANTS_ST:-}"
bench gguf_a gguf:Q4_K,gguf:Q5_K,gguf:Q8_0,gguf:Q6_K,gguf:Q2_K,gguf:Q3_K "${VARIANTS_GGUF_A:-}"
bench gguf_b gguf:IQ4_NL,gguf:IQ4_XS,gguf:MXFP4,gguf:Q4_0,gguf:IQ2_XXS,gguf:IQ2_XS,gguf:IQ3_XXS,gguf:IQ3_S \
  "${VARIANTS_GGUF_B:-}"
grep -E "^decode|^  [a-z]" "$out/bench.log" | cut -c1-120
elapsed bench
if [ -n "${SANITIZE_K:-}" ]; then
  compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
    tests/test_cuda_staged.py -k "$SANITIZE_K" > "$out/sanitizer.log" 2>&1 || status=1
  tail -4 "$out/sanitizer.log"
fi
elapsed all
# the verdicts again, last: a device call returns only its output's tail, which the bench fills
echo "== summary"
grep -hE "passed|failed" "$out/gpu_suite.log" | tail -1
grep -hE "samples round-trip" "$out/demo.log" | cut -c1-80
[ -n "${SANITIZE_K:-}" ] && grep -hE "ERROR SUMMARY|passed|failed" "$out/sanitizer.log" | tail -2
echo "status $status"
exit $status
