#!/bin/bash
# helper IQ3's second device call (share-bound: no more than ~95 s of command): the int8 grid units
# with the grid in copies; IQ3 types only, T = 1 only (T > 1 takes none of this: call 1)
cd "$(dirname "$0")"
sed -i 's/^    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \\$/    X(IQ3_XXS) X(IQ3_S)/; /^    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)$/d' csrc/formats/gguf/decoders.cuh
rm -f csrc/formats/{bf16,fp8_block,nvfp4,mxfp8,mxfp4,ds_fp4}/cuda.cu
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 85 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { echo "build failed or over 85 s"; tail -5 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 16 python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1 \
  --formats gguf:IQ3_XXS,gguf:IQ3_S --variants int8-1,int8-1-copies-0,int8-1-copies-1,int8-gate_up --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^decode|^  int8" $OUT/bench.log | cut -c1-120
t0=$(date +%s)
timeout 15 python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py -n 4 -k "test_gguf_int8_grid_units and not rule and not 0 and not far and not down_other" > $OUT/tests_int8.log 2>&1
echo "int8 tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" $OUT/tests_int8.log | tail -1; grep -E "^FAILED|^E  " $OUT/tests_int8.log | head -6
