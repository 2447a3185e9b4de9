#!/bin/bash
# helper IQ2's device call 2 (lean: call 1 also ran compute-sanitizer on -k "test_gguf_int8_iq2 and small and not default" and the types' other tests): IQ2_XXS / IQ2_XS int8 units at T = 1
cd "$(dirname "$0")"
sed -i 's/^    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \\$/    X(Q8_0) X(IQ2_XXS) X(IQ2_XS)/; /^    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)$/d' csrc/formats/gguf/decoders.cuh
rm -f csrc/formats/{bf16,fp8_block,nvfp4,mxfp8,mxfp4,ds_fp4}/cuda.cu
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 150 python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 60 python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:IQ2_XXS,gguf:IQ2_XS --variants int8-0,int8-copies-1 --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $OUT/bench.log | tail -40
t0=$(date +%s)
timeout 40 python3 -m pytest -q -rP -p no:cacheprovider tests/test_cuda_kernels_gguf.py -n 14 -k "test_gguf_int8_iq2" > $OUT/tests_int8.log 2>&1; echo "int8 tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" $OUT/tests_int8.log | tail -2; grep -E "^FAILED|^E  " $OUT/tests_int8.log | head -8
grep -E "gguf cuda accuracy" $OUT/tests_int8.log | sed -E 's/^.*gguf cuda accuracy //' | sort | head -8
