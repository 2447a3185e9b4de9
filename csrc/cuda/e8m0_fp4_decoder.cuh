// The decoder of the E8M0-scaled FP4 formats (mxfp4, ds_fp4): e2m1 pairs (low nibble first), one
// E8M0 scale per 32 inputs = one per 16-byte unit. e2m1 * 2^k is exact in bf16 for scales from
// 2^-64 to 2^63 (bytes 63..190; real checkpoints sit near 2^-10): the weights carry 2^-62, so a
// byte above 190 would overflow to inf and one below 63 lose bits to bf16 subnormals.
#pragma once

#include "cuda/scaled_units.cuh"

namespace ftw::cuda {

struct E8m0Fp4Decoder : ScaledUnits<4, uint8_t, 1> {
    static constexpr int VEC = 32;
    // SCALE2: the scale pair by one add-and-clamp and one multiply (e8m0_bf16x2), else by
    // e8m0_bf16 and a shift (the staged kernel without kOptScale2 runs that: decode_v1)
    template <bool MUL = true, bool SCALE2 = true>
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t m2;  // 2^(s-127) * 2^64 in both halves: with e2m1's 2^-126, w * 2^-62
        if (SCALE2) {
            m2 = e8m0_bf16x2(raw.s, 64);
        } else {
            const uint32_t m = e8m0_bf16(raw.s, 64);
            m2 = m | (m << 16);
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
            for (int k = 0; k < 4; ++k) w[4 * i + k] = hmul2(v[k], m2);
        }
    }
    // the decode before (e2m1 by shifts): the staged kernel runs it under FTW_CUDA_STAGED_OPT=0,
    // so that one benchmark run times both
    __device__ static void decode_v0(const Raw& raw, uint32_t (&w)[16]) { decode<false, false>(raw, w); }
    __device__ static void decode_v1(const Raw& raw, uint32_t (&w)[16]) { decode<true, false>(raw, w); }
    // The staged kernel's unit columns at T = 1 (kOptUnitCols, experts_kernels.cuh): the unit
    // unscaled, and the factor of its float32 sum: 2^(s - 127) * 2^(64 - kUnitColsX), by one
    // add-and-clamp and a shift; bytes 0..247 exact (the decode's range is 63..190), 248..255 (NaN)
    // give inf.
    static constexpr int kUnitGroups = 1;
    __device__ static void decode_raw(const uint4& u, uint32_t (&r)[16]) { e2m1_unit_raw(u, r); }
    __device__ static void group_scales(const Side& s, float (&f)[1]) {
        f[0] = __uint_as_float(__viaddmin_u32(s.s, uint32_t(64 - kUnitColsX), 255u) << 23);
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_fp4(x, a); }
    __device__ static int act_pos(int j) { return fp4_pair_pos(j); }  // act in permute's order (kOptActPerm)
    __device__ static float post(const KernelParams&, int, int, int) { return kTwo62; }
};

// banks 0-3 of both formats: gate_up [2I, H/2] u8, down [H, I/2], gate_up_scale [2I, H/32] e8m0,
// down_scale [H, I/32]
inline int e8m0_fp4_needs(int H, int I, BankNeed* out) {
    out[0] = {0, "gate_up", int64_t(2) * I * (H / 2), 16, false};
    out[1] = {1, "down", int64_t(H) * (I / 2), 16, false};
    out[2] = {2, "gate_up_scale", int64_t(2) * I * (H / 32), 1, false};
    out[3] = {3, "down_scale", int64_t(H) * (I / 32), 1, false};
    return 4;
}

}  // namespace ftw::cuda
