// bf16 experts on the GPU: rows are already bf16, so the decoder hands the stored pairs to the
// tensor cores unchanged (exact). Optional expert biases (gpt-oss bf16).
#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {
namespace {

template <class Shape>
struct Bf16Decoder {
    using RegisterShape = Shape;
    static constexpr int VEC = 8;
    struct Row { const uint4* w; };
    struct Raw { uint4 w; };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int in = proj == 0 ? p.H : p.I;
        return {reinterpret_cast<const uint4*>(bank_row(p, proj, slot) + int64_t(r) * in * 2)};
    }
    __device__ static Raw load(const Row& row, int u) { return {ld_stream<Shape::L2Bytes>(row.w + u)}; }
    // experts_decode_staged runs bf16 but is not its default: measured slower at T=1 (H200,
    // deepseek-v3 size: 0.62x the ceiling against experts_decode's 0.77x; docs/BENCHMARKS.md)
    static constexpr bool kStaged = false;
    // no early weights by default (experts_kernels.cuh, early_weights): H200, qwen3-30b-a3b, T=1,
    // two runs disagreed (0.69 -> 0.71 as a variant, 0.69 -> 0.64 as the default, with T=8
    // faster in both; deepseek-v3 equal)
    static constexpr bool kEarlyWeights = false;
    struct Side {};
    __device__ static const uint8_t* weights(const KernelParams& p, int proj, int slot) { return bank_row(p, proj, slot); }
    __device__ static int64_t weight_row_bytes(const KernelParams& p, int proj) {
        const int in = proj == 0 ? p.H : p.I;
        return int64_t(in * 2);
    }
    __device__ static Side side(const Row&, int) { return {}; }
    __device__ static Raw raw(const uint4& w, const Side&) { return {w}; }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[4]) {
        w[0] = raw.w.x, w[1] = raw.w.y, w[2] = raw.w.z, w[3] = raw.w.w;
    }
    __device__ static void permute(const uint32_t (&x)[4], uint32_t (&a)[4]) { permute_identity(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return 1.0f; }
};

// banks: gate_up [2I, H] bf16, down [H, I] bf16, gate_up_bias [2I], down_bias [H] (optional)
int needs(int H, int I, const KernelParams& p, BankNeed* out) {
    const int b = p.bias_f32 ? 4 : 2;
    out[0] = {0, "gate_up", int64_t(2) * I * H * 2, 16, false};
    out[1] = {1, "down", int64_t(H) * I * 2, 16, false};
    out[2] = {2, "gate_up_bias", int64_t(2) * I * b, b, true};
    out[3] = {3, "down_bias", int64_t(H) * b, b, true};
    return 4;
}

// RegisterShape<NT, D, XRing, MaxRegs, ScaleRing, L2Bytes, Pdl>
void launch(const KernelParams& p, cudaStream_t stream) {
    launch_shaped<Bf16Decoder, RegisterShape<2, 2, false, 128, false, 256, true>,  // the default; then rs<i>:
                  RegisterShape<2, 2, true, 128, false, 0, false>,    // 1: main's before (x in the ring)
                  RegisterShape<2, 2, true, 128, false, 256, true>,   // 2: x in the ring
                  RegisterShape<2, 3, false, 128, false, 256, true>,  // 3: 3 chunks in flight
                  RegisterShape<2, 2, false, 128, false, 128, true>>(p, stream);  // 4: L2 prefetch 128 bytes
}

}  // namespace

FTW_CUDA_FORMAT_LAUNCH(bf16, 8, &launch, needs, 2, 3, false);

}  // namespace ftw::cuda
