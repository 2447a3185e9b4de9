// NVFP4 experts on the GPU: e2m1 pairs (low nibble first), one e4m3 scale per 16 inputs, one
// float32 global per row. A 16-byte unit holds 32 values and their two block scales; e2m1 times
// an e4m3 scale has at most 6 significant bits, so the bf16 weights are exact, and the global
// multiplies the row's dot product afterwards (exact up to float32 accumulation).
#include <cuda_fp16.h>

#include "cuda/scaled_units.cuh"

namespace ftw::cuda {
namespace {

struct Nvfp4Decoder : ScaledUnits<4, unsigned short, 1> {
    static constexpr int VEC = 32;
    // MUL = false: the decode before (scales through float, e2m1 by shifts), which the staged
    // kernel runs under FTW_CUDA_STAGED_OPT=0 (decode_v0), so that one benchmark run times both
    template <bool MUL = true>
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t m2[2];  // scale * 2^64 per 16 values: with e2m1's 2^-126, w * 2^-62 (exact)
        if (MUL) {
            // the two e4m3 scales by bit placement into one bf16x2 (scale * 2^-120, exact also for
            // e4m3 subnormals), times 2^127 and 2^57 (exact)
            const uint32_t t = prmt(raw.s, 0u, 0x4140);  // scale byte k -> low byte of half k
            const uint32_t sc = hmul2(hmul2(((t & 0x00800080u) << 8) | ((t & 0x007F007Fu) << 4), 0x7F007F00u), 0x5C005C00u);
            m2[0] = prmt(sc, 0u, 0x1010), m2[1] = prmt(sc, 0u, 0x3232);
        } else {
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float s = e4m3_to_float((raw.s >> (8 * k)) & 0xFFu) * 1.8446744073709552e19f;
                const uint32_t m = __float_as_uint(s) >> 16;
                m2[k] = m | (m << 16);
            }
        }
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t v[4];
            if (MUL)
                e2m1x8_raw_mul(q[i], v);
            else
                e2m1x8_raw(q[i], v);
#pragma unroll
            for (int k = 0; k < 4; ++k) w[4 * i + k] = hmul2(v[k], m2[i / 2]);
        }
    }
    __device__ static void decode_v0(const Raw& raw, uint32_t (&w)[16]) { decode<false>(raw, w); }
    // The staged kernel's unit columns at T = 1 (kOptUnitCols, experts_kernels.cuh): the unit
    // unscaled, and the factors of its two 16-value groups' float32 sums: the e4m3 scale pair by
    // one cvt.rn.f16x2.e4m3x2 (every e4m3 value, subnormals included, is exact in f16) and each
    // half to float32 (exact), so a factor is the scale itself; the rest of the decode's 2^64
    // (2^(64 - kUnitColsX)) multiplies the item's row sums once (kUnitColsPost). 0x7F / 0xFF
    // (NaN) give NaN where e4m3_to_float gives 480 (real scales are finite).
    // The experts kernel puts the two groups in columns 2 tig and 2 tig + 1 of one mma chain.
    // (FP4I placed each byte into a float and multiplied by 2^127, ~10 instructions per unit and
    // row where this takes 3, with a chain per group: its 32-row kernels spilled.) Not by default
    // (kUnitColsDefault): H200, T = 1, same run, against the decode: deepseek-v3 86.2 / 85.8 us
    // (level, 15-19% fewer instructions per stage), qwen3-30b-a3b 20.4 / 19.9 us
    // (docs/BENCHMARKS.md "FP4J"); FTW_CUDA_STAGED_UNITCOLS=1 runs it.
    static constexpr int kUnitGroups = 2;
    static constexpr bool kUnitColsDefault = false;
    static constexpr float kUnitColsPost = float(1ull << (64 - kUnitColsX));
    static_assert(64 - kUnitColsX >= 0 && 64 - kUnitColsX < 63, "the sums' factor must be a power of 2 >= 1");
    __device__ static void decode_raw(const uint4& u, uint32_t (&r)[16]) { e2m1_unit_raw(u, r); }
    __device__ static void group_scales(const Side& s, float (&f)[2]) {
        uint32_t h2;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(s.s)));
        const __half2 h = *reinterpret_cast<const __half2*>(&h2);
        f[0] = __low2float(h), f[1] = __high2float(h);  // byte 0: the first 16 values' scale
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_fp4(x, a); }
    __device__ static int act_pos(int j) { return fp4_pair_pos(j); }  // act in permute's order (kOptActPerm)
    __device__ static float post(const KernelParams& p, int proj, int slot, int r) {
        return kTwo62 * __ldg(reinterpret_cast<const float*>(bank_row(p, 4 + proj, slot)) + r);
    }
};

// banks: gate_up [2I, H/2] u8, down [H, I/2], gate_up_scale [2I, H/16] e4m3, down_scale [H, I/16],
// gate_up_global [2I] f32, down_global [H] f32
int needs(int H, int I, const KernelParams&, BankNeed* out) {
    out[0] = {0, "gate_up", int64_t(2) * I * (H / 2), 16, false};
    out[1] = {1, "down", int64_t(H) * (I / 2), 16, false};
    out[2] = {2, "gate_up_scale", int64_t(2) * I * (H / 16), 2, false};
    out[3] = {3, "down_scale", int64_t(H) * (I / 16), 2, false};
    out[4] = {4, "gate_up_global", int64_t(2) * I * 4, 4, false};
    out[5] = {5, "down_global", int64_t(H) * 4, 4, false};
    return 6;
}

}  // namespace

FTW_CUDA_FORMAT(nvfp4, Nvfp4Decoder, needs, -1, -1, false);

}  // namespace ftw::cuda
