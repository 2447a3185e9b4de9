#!/bin/bash
# The device call for T8X's Q2_K (prepared without device time, eleventh session): gguf Q2_K int8 units
# at T = 2..8 (kOptInt8Tokens with kInt8TokensMins in Int8TokenRows; off by default, FTW_GGUF_CUDA_INT8_T8
# forces it). Build trimmed to Q8_0 and Q2_K (the snapshot only), the int8-tokens tests of Q2_K, the
# sanitizer on a few, the bench of the default (Q2_K's T8 off) against int8-t8-1 and each phase alone,
# then Q2_K's other tests. Run it in a snapshot (`git archive HEAD | tar -x` into .snap_t8x, carried
# with .whl), never in a checkout: it trims the build in place.
cd "$(dirname "$0")/.."
if [ -e .git ]; then  # (a snapshot has no .git of its own)
  echo "scripts/run_t8x_q2.sh: run it in a snapshot made by git archive, not in a git checkout (it edits the tree)"; exit 1
fi
sed -i 's/^    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \\$/    X(Q8_0) X(Q2_K)/; /^    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)$/d' csrc/formats/gguf/decoders.cuh
grep -n "X(Q8_0) X(Q2_K)$" csrc/formats/gguf/decoders.cuh || { echo "trim failed"; exit 1; }
rm -f csrc/formats/{bf16,fp8_block,nvfp4,mxfp8,mxfp4,ds_fp4}/cuda.cu
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
P="python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py"
t0=$(date +%s)
timeout 90 $P -n 14 -k "test_gguf_int8_tokens and Q2_K" > $OUT/tests_t8x_q2.log 2>&1; echo "int8 tokens tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" $OUT/tests_t8x_q2.log | tail -2; grep -E "^FAILED|^E  " $OUT/tests_t8x_q2.log | head -12
grep -E "gguf cuda accuracy" $OUT/tests_t8x_q2.log | sed -E 's/^.*gguf cuda accuracy //' | sort | head -40
t0=$(date +%s)
timeout 90 python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:Q2_K --variants int8-t8-1,int8-t8-gate_up,int8-t8-down --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $OUT/bench.log | tail -24
t0=$(date +%s)
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
  -k "test_gguf_int8_tokens and Q2_K and small and mixed" > $OUT/sanitizer.log 2>&1; echo "sanitizer rc=$? $(( $(date +%s) - t0 )) s"
grep -E "ERROR SUMMARY|passed|failed" $OUT/sanitizer.log | tail -3
t0=$(date +%s)
timeout 60 $P -n 14 -k "Q2_K and not int8_tokens" > $OUT/tests_q2k.log 2>&1; echo "Q2_K tests rc=$? $(( $(date +%s) - t0 )) s"
tail -1 $OUT/tests_q2k.log; grep -E "^FAILED" $OUT/tests_q2k.log | head -8
