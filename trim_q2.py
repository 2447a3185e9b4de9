"""Helper Q2's device call: cut the snapshot's build (never the branch) to what its tests and bench
run, as K6's second call did: the types Q6_K and Q2_K, each launched as its default staged decoder
on sub-block sums with d once per chunk (Q2_K with wide lanes), decode only (T <= 8: no prefill),
no table-driven decoder, no safetensors formats."""
import pathlib
import re

d = pathlib.Path("csrc/formats/gguf/decoders.cuh")
s = d.read_text()
s, n = re.subn(r"#define FTW_GGML_CUDA_TYPES\(X\)\s*\\\n.*\\\n.*\n", "#define FTW_GGML_CUDA_TYPES(X) X(Q6_K) X(Q2_K)\n", s)
assert n == 1
d.write_text(s)

sl = pathlib.Path("csrc/formats/gguf/slice.cuh")
s = sl.read_text()
a = s.index("template <class T>\nvoid launch_typed(")
b = s.index("constexpr bool in_slice(")
s = s[:a] + '''template <class T>
void launch_typed(int phase, GgufMode, const KernelParams& p, cudaStream_t stream) {
    constexpr bool pf = HasPrefetch<Fast<T>>::value;
    if constexpr (SubBlocks<Fast<T>>::value)
        launch_with<SubBlockRows<TypedDecoder<T, pf, true>, true, HasDecodeWide<Fast<T>>::value>, true>(phase, p, stream);
}

void launch_table_driven(int, GgufMode, const KernelParams&, cudaStream_t) {}

''' + s[b:]
sl.write_text(s)
for f in ("bf16", "fp8_block", "nvfp4", "mxfp8", "mxfp4", "ds_fp4"):
    pathlib.Path(f"csrc/formats/{f}/cuda.cu").unlink(missing_ok=True)
print("trimmed:", open(d).read().count("X(Q6_K) X(Q2_K)"), "type list;", "launch_typed cut")
