"""Helper QF's device call: cut the snapshot's build (never the branch) to what its tests and bench run,
as trim_q2.py (4092cc8) did: the types Q4_0, IQ4_NL, IQ4_XS, Q2_K, decode only (T <= 8: no prefill), no
table-driven decoder, no safetensors formats. Each type keeps the decoders its T = 1 and T = 8 steps
take by default or with FTW_GGUF_CUDA_INT8=1: the staged TypedDecoder (its int8 kernels inside) where
launch_typed's `staged` says, else the register-fed ShapedDecoder; Q2_K its SubBlockRows on sums with
d once per chunk and wide lanes (its lanes16 and int8 unit-sum kernels inside). Call 1 of the full
launch_typed (call 1, 2026-12-01) did not finish the Q2_K slice in 100 s."""
import pathlib
import re

d = pathlib.Path("csrc/formats/gguf/decoders.cuh")
s = d.read_text()
s, n = re.subn(r"#define FTW_GGML_CUDA_TYPES\(X\)\s*\\\n.*\\\n.*\n",
               "#define FTW_GGML_CUDA_TYPES(X) X(Q4_0) X(IQ4_NL) X(IQ4_XS) X(Q2_K)\n", s)
assert n == 1
d.write_text(s)

sl = pathlib.Path("csrc/formats/gguf/slice.cuh")
s = sl.read_text()
a = s.index("template <class T>\nvoid launch_typed(")
b = s.index("// The act order down of type T reads")  # (actq_order stays)
s = s[:a] + '''template <class T>
void launch_typed(int phase, GgufMode, const KernelParams& p, cudaStream_t stream) {
    constexpr bool pf = HasPrefetch<Fast<T>>::value;
    if constexpr (SubBlocks<Fast<T>>::value) {
        launch_with<SubBlockRows<TypedDecoder<T, pf, true>, true, HasDecodeWide<Fast<T>>::value>, true>(phase, p, stream);
    } else {
        const bool staged = StagedPreferred<Fast<T>>::value || (StagedManyItems<Fast<T>>::value && staged_for_items(p, phase)) ||
                            int8_for<T>(p, phase) || int8_tokens_for<T>(p, phase);
        if (staged) return launch_with<TypedDecoder<T, pf, true>, true>(phase, p, stream);  // (SharedLoads: these types' default)
        if constexpr (!StagedPreferred<Fast<T>>::value) launch_with<ShapedDecoder<TypedDecoder<T, pf, false>>, true>(phase, p, stream);
    }
}

''' + s[b:]
s = s.replace("    launch_with<GgmlDecoder>(phase, p, stream);\n", "")  # (the table-driven decoder: none,
s = s.replace("    if constexpr (in_slice(I)) register_gguf_launch(kTableDriven, launch_table_driven);\n", "")  # nor registered)
sl.write_text(s)
for f in ("bf16", "fp8_block", "nvfp4", "mxfp8", "mxfp4", "ds_fp4"):
    pathlib.Path(f"csrc/formats/{f}/cuda.cu").unlink(missing_ok=True)
print("trimmed: types", open(d).read().count("X(Q4_0) X(IQ4_NL) X(IQ4_XS) X(Q2_K)"), "; launch_typed cut")
