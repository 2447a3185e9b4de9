#!/bin/bash
# helper QF's device call (eleventh session): act quantized by phase 0 itself (FTW_GGUF_CUDA_ACTQ_FUSED)
# against main's quantize_int8<.., 1> launch. Build trimmed (in the snapshot only) to Q4_0, IQ4_NL,
# IQ4_XS, Q2_K, decode kernels only (launch_with's DecodeOnly), no table-driven decoder, no
# safetensors formats; the new tests, the bench, memcheck on a few. Run it in a snapshot (git archive
# into .snap_qf, carried with .whl), never in a checkout: it edits the tree.
cd "$(dirname "$0")/.."
if [ -e .git ]; then echo "scripts/run_qf.sh: run it in a snapshot made by git archive"; exit 1; fi
T0=$(date +%s)
sed -i 's/^    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \\$/    X(Q4_0) X(IQ4_NL) X(IQ4_XS) X(Q2_K)/; /^    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)$/d' csrc/formats/gguf/decoders.cuh
grep -q "X(Q4_0) X(IQ4_NL) X(IQ4_XS) X(Q2_K)$" csrc/formats/gguf/decoders.cuh || { echo "trim failed"; exit 1; }
sed -i 's/template <class Dec, bool DecodeOnly = false>/template <class Dec, bool DecodeOnly = true>/; s/^    launch_with<GgmlDecoder>(phase, p, stream);$//; s/^    if constexpr (in_slice(I)) register_gguf_launch(kTableDriven, launch_table_driven);$//' csrc/formats/gguf/slice.cuh
grep -q "DecodeOnly = true" csrc/formats/gguf/slice.cuh || { echo "slice trim failed"; exit 1; }
rm -f csrc/formats/{bf16,fp8_block,nvfp4,mxfp8,mxfp4,ds_fp4}/cuda.cu
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 100 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { echo "build failed $(( $(date +%s) - T0 )) s"; grep -E "error" $OUT/build.log | head -20; tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
P="python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py"
t0=$(date +%s)
timeout 35 $P -n 14 -k "test_gguf_int8_actq_fused" > $OUT/tests.log 2>&1; echo "tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" $OUT/tests.log | tail -2; grep -E "^FAILED|^E  " $OUT/tests.log | head -12
grep -E "gguf cuda accuracy" $OUT/tests.log | sed -E 's/^.*gguf cuda accuracy //' | sort > $OUT/accuracy.txt; head -30 $OUT/accuracy.txt
t0=$(date +%s)
left=$(( 150 - ($(date +%s) - T0) )); [ $left -lt 30 ] && left=30
timeout $left python3 -u bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:Q4_0,gguf:IQ4_NL,gguf:Q2_K,gguf:IQ4_XS --variants actq-fused-1,int8-1-actq-0,int8-1-actq-1 --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $OUT/bench.log | grep -v "T=8 same experts / T=1" | tail -70
t0=$(date +%s)
left=$(( 158 - ($(date +%s) - T0) )); [ $left -lt 8 ] && left=8
timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
  -k "test_gguf_int8_actq_fused and small and (Q4_0 or Q2_K)" > $OUT/sanitizer.log 2>&1; echo "sanitizer rc=$? $(( $(date +%s) - t0 )) s"
grep -E "ERROR SUMMARY|passed|failed" $OUT/sanitizer.log | tail -3
echo "total $(( $(date +%s) - T0 )) s"
