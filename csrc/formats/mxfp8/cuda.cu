// MXFP8 experts on the GPU: e4m3 weights, one E8M0 scale per 32 inputs. A 16-byte unit is half a
// scale block; e4m3 * 2^k is exact in bf16, so the decode is exact (for scale bytes up to 196,
// 2^69: the weights carry 2^-62; real checkpoints sit near 2^-10).
#include "cuda/scaled_units.cuh"

namespace ftw::cuda {
namespace {

struct Mxfp8Decoder : ScaledUnits<8, uint8_t, 2> {
    static constexpr int VEC = 16;
    __device__ static void decode(const Raw& raw, uint32_t (&w)[8]) {
        const uint32_t m = e8m0_bf16(raw.s, 58);  // 2^(s-127) * 2^58: with e4m3's 2^-120, w * 2^-62
        const uint32_t m2 = m | (m << 16);
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            e4m3x4_raw(q[i], lo, hi);
            w[2 * i] = hmul2(lo, m2);
            w[2 * i + 1] = hmul2(hi, m2);
        }
    }
    __device__ static void permute(const uint32_t (&x)[8], uint32_t (&a)[8]) { permute_fp8(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return kTwo62; }
};

// banks: gate_up [2I, H] e4m3, down [H, I] e4m3, gate_up_scale [2I, H/32] e8m0, down_scale [H, I/32]
int needs(int H, int I, const KernelParams&, BankNeed* out) {
    out[0] = {0, "gate_up", int64_t(2) * I * H, 16, false};
    out[1] = {1, "down", int64_t(H) * I, 16, false};
    out[2] = {2, "gate_up_scale", int64_t(2) * I * (H / 32), 1, false};
    out[3] = {3, "down_scale", int64_t(H) * (I / 32), 1, false};
    return 4;
}

}  // namespace

FTW_CUDA_FORMAT(mxfp8, Mxfp8Decoder, needs, -1, -1, false);

}  // namespace ftw::cuda
