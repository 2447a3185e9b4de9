#!/bin/bash
# helper NL8's device call (twelfth session): IQ4_NL's / IQ4_XS's T8 split to s8 by tables of bit 7 set
# (iq4nl_s8_*) against the split before (FTW_GGUF_CUDA_IQ4_SPLIT=old, bench variant iq4-split-old).
# Build trimmed to Q4_0, IQ4_NL and IQ4_XS (the snapshot only), the IQ4 int8-tokens tests (forced and
# default, and the old split's output bit for bit), the bench of both splits in interleaved rounds, the
# sanitizer on a few. One budget of LIMIT seconds for all (the device share), each step under a guard.
# Run it in a snapshot (`git archive HEAD | tar -x` into .snap_nl8, carried with .whl), never in a
# checkout: it trims the build in place.
cd "$(dirname "$0")/.."
if [ -e .git ]; then echo "run it in a snapshot made by git archive, not in a git checkout (it edits the tree)"; exit 1; fi
t0=$(date +%s); LIMIT=${LIMIT:-122}
left() { local s=$(( LIMIT - ($(date +%s) - t0) - ${1:-0} )); echo $(( s < 1 ? 1 : s )); }  # (timeout 0 would mean none)
sed -i 's/^    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \\$/    X(Q4_0) X(IQ4_NL) X(IQ4_XS)/; /^    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)$/d' csrc/formats/gguf/decoders.cuh
grep -n "X(Q4_0) X(IQ4_NL) X(IQ4_XS)$" csrc/formats/gguf/decoders.cuh || { echo "trim failed"; exit 1; }
rm -f csrc/formats/{bf16,fp8_block,nvfp4,mxfp8,mxfp4,ds_fp4}/cuda.cu
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout $(left 30) python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
B="build $(( $(date +%s) - t0 )) s"; echo "$B"
t1=$(date +%s)
# (a selection, for the share: T = 8 same at every size, a few of T = 2 / 3, back to back, far apart, and
# the old split against the new bit for bit)
F=tests/test_cuda_kernels_gguf.py
S="$F::test_gguf_int8_tokens_split_old"
for c in IQ4_NL-small-8-same IQ4_NL-chunks-8-same IQ4_NL-partial-8-same IQ4_NL-small-3-mixed IQ4_NL-chunks-2-random \
         IQ4_XS-small-8-same IQ4_XS-chunks-8-same IQ4_XS-xs-8-same IQ4_XS-xs-3-mixed IQ4_XS-small-2-random; do
  S="$S $F::test_gguf_int8_tokens[$c]"; done
S="$S $F::test_gguf_int8_tokens_back_to_back $F::test_gguf_int8_tokens_far_apart[IQ4_NL-same] $F::test_gguf_int8_tokens_far_apart[IQ4_XS-random]"
timeout $(left 28) python3 -m pytest -q -rP -p no:cacheprovider -n 14 $S -k "IQ4" > $OUT/tests.log 2>&1; R=$?
TS="tests rc=$R $(( $(date +%s) - t1 )) s: $(grep -E "passed|failed" $OUT/tests.log | tail -1)"; echo "$TS"
t1=$(date +%s)
PYTHONUNBUFFERED=1 timeout $(left 6) python3 bench/bench_kernels.py --sizes deepseek-v3,qwen3-30b-a3b --no-prefill --replays 5 --cases 1,8same \
  --formats gguf:IQ4_NL,gguf:IQ4_XS --variants iq4-split-old --json $OUT/bench.json > $OUT/bench.log 2>&1
BE="bench rc=$? $(( $(date +%s) - t1 )) s"
t1=$(date +%s)
timeout $(left) compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels_gguf.py \
  -k "test_gguf_int8_tokens_split_old and small" > $OUT/sanitizer.log 2>&1
SA="sanitizer rc=$? $(( $(date +%s) - t1 )) s: $(grep -E "ERROR SUMMARY" $OUT/sanitizer.log | tail -1) $(grep -E "passed|failed" $OUT/sanitizer.log | tail -1)"
# key lines last (the call returns the output's tail)
grep -E "^FAILED|^E  " $OUT/tests.log | head -8
grep -E "gguf cuda accuracy" $OUT/tests.log | sed -E 's/^.*gguf cuda accuracy //' | grep -E "split|T=8 same" | sort | head -12
grep -E "^decode|^  [a-z]" $OUT/bench.log | cut -c1-110
echo "$B"; echo "$TS"; echo "$BE"; echo "$SA"; echo "total $(( $(date +%s) - t0 )) s"
