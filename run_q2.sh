#!/bin/bash
# helper Q2's device calls: Q2_K at T = 1 on int8 unit sums (kOptInt8Sums in kOptLanes16's kernel).
# Call 1 (snapshot of b80d498, the build trimmed to X(Q8_0) X(Q6_K) X(Q2_K) by sed) ran the int8 tests,
# the bench (int8-0,int8-1,int8-gate_up,int8-down), the sanitizer and the lanes16 tests; this is call 2.
cd "$(dirname "$0")"
python3 trim_q2.py || exit 1  # the snapshot's build cut to Q6_K, Q2_K's default staged kernels, decode only
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
P="python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py"
t0=$(date +%s)
timeout 60 $P -n 14 -k "(int8_sums16 or (back_to_back and Q2_K)) and not Q8_0" > $OUT/tests_int8.log 2>&1; echo "int8 tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" $OUT/tests_int8.log | tail -2; grep -E "^FAILED|^E  " $OUT/tests_int8.log | head -12
grep -E "gguf cuda (accuracy|int8 default)" $OUT/tests_int8.log | sed -E 's/^.*gguf cuda //' | sort | head -24
t0=$(date +%s)
timeout 60 python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:Q2_K --variants int8-0,int8-1,int8-gate_up,int8-down --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $OUT/bench.log | tail -30
t0=$(date +%s)
timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
  -k "test_gguf_int8_sums16 and (small or two_warps)" > $OUT/sanitizer.log 2>&1; echo "sanitizer rc=$? $(( $(date +%s) - t0 )) s"
grep -E "ERROR SUMMARY|passed|failed" $OUT/sanitizer.log | tail -3
