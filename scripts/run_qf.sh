#!/bin/bash
# helper QF's device call (eleventh session): act quantized by phase 0 itself (FTW_GGUF_CUDA_ACTQ_FUSED)
# against main's quantize_int8<.., 1> launch. Build trimmed (in the snapshot only) to Q4_0, IQ4_NL,
# IQ4_XS, Q2_K, each type's default decoders only, decode only (scripts/trim_qf.py), no table-driven
# decoder, no safetensors formats; the new tests, the bench, memcheck on a few. (Call 1 of 2026-12-01
# cut launch_typed less and its Q2_K slice did not build in 100 s: expect the build to take 60-120 s.) Run it in a snapshot (git archive
# into .snap_qf, carried with .whl), never in a checkout: it edits the tree.
cd "$(dirname "$0")/.."
if [ -e .git ]; then echo "scripts/run_qf.sh: run it in a snapshot made by git archive"; exit 1; fi
T0=$(date +%s)
python3 scripts/trim_qf.py || { echo "trim failed"; exit 1; }
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { echo "build failed $(( $(date +%s) - T0 )) s"; grep -E "error" $OUT/build.log | head -20; tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
P="python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py"
t0=$(date +%s)
timeout 35 $P -n 14 -k "test_gguf_int8_actq_fused" > $OUT/tests.log 2>&1; echo "tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" $OUT/tests.log | tail -2; grep -E "^FAILED|^E  " $OUT/tests.log | head -12
grep -E "gguf cuda accuracy" $OUT/tests.log | sed -E 's/^.*gguf cuda accuracy //' | sort > $OUT/accuracy.txt; head -30 $OUT/accuracy.txt
t0=$(date +%s)  # main's int8 tests of these types with the fused way on (types not built left out)
FTW_GGUF_CUDA_ACTQ_FUSED=1 timeout 40 $P -n 14 -k "(test_gguf_int8_units or test_gguf_int8_sums16) and not MXFP4 and not Q5_K and not other_type and not far_apart" > $OUT/tests_int8.log 2>&1
echo "int8 tests, fused on: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" $OUT/tests_int8.log | tail -1; grep -E "^FAILED" $OUT/tests_int8.log | head -8
t0=$(date +%s)
left=120
timeout $left python3 -u bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:Q4_0,gguf:IQ4_NL,gguf:Q2_K,gguf:IQ4_XS --variants actq-fused-1,int8-1-actq-0,int8-1-actq-1 --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $OUT/bench.log | grep -v "T=8 same experts / T=1" | tail -70
t0=$(date +%s)
left=60
timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
  -k "test_gguf_int8_actq_fused and small and (Q4_0 or Q2_K)" > $OUT/sanitizer.log 2>&1; echo "sanitizer rc=$? $(( $(date +%s) - t0 )) s"
grep -E "ERROR SUMMARY|passed|failed" $OUT/sanitizer.log | tail -3
echo "total $(( $(date +%s) - T0 )) s"
