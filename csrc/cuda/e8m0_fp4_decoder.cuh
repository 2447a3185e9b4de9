// The decoder of the E8M0-scaled FP4 formats (mxfp4, ds_fp4): e2m1 pairs (low nibble first), one
// E8M0 scale per 32 inputs = one per 16-byte unit. e2m1 * 2^k is exact in bf16 for scales from
// 2^-64 to 2^63 (bytes 63..190; real checkpoints sit near 2^-10): the weights carry 2^-62, so a
// byte above 190 would overflow to inf and one below 63 lose bits to bf16 subnormals.
#pragma once

#include "cuda/scaled_units.cuh"

namespace ftw::cuda {

struct E8m0Fp4Decoder : ScaledUnits<4, uint8_t, 1> {
    static constexpr int VEC = 32;
    template <bool MUL = true>
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t m = e8m0_bf16(raw.s, 64);  // 2^(s-127) * 2^64: with e2m1's 2^-126, w * 2^-62
        const uint32_t m2 = m | (m << 16);
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
    __device__ static void decode_v0(const Raw& raw, uint32_t (&w)[16]) { decode<false>(raw, w); }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_fp4(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return kTwo62; }
};

// The same units through e4m3 bytes (experts_kernels.cuh, "fp8 units"): the staged kernel
// reads word tig of each unit (8 values) and places them as e4m3 bytes, the unit's scale applied
// to the mma's float32 sums as 2^(s - 127) (a float by a shift: s = 0 gives 0 where 2^-127 would be
// a float subnormal, s = 255 inf), the 2^6 of the placement in fp8_split's factor per row. The
// scale covers every byte 1..254 (the bf16 decode above: 63..190; only the usual range is tested).
struct E8m0Fp4Fp8Decoder : E8m0Fp4Decoder {
    static constexpr bool kFp8Units = true;
    // e2m1 pairs of a word (value 2i low nibble, 2i + 1 high nibble of byte i) -> e4m3 bytes of
    // value * 2^-6: lo = values 0, 2, 4, 6 (k = 4 tig .. 4 tig + 3), hi = 1, 3, 5, 7 (k + 16)
    __device__ static void e4m3_pair(uint32_t w, uint32_t& lo, uint32_t& hi) {
        lo = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
        hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
    }
    // the scale bytes of units u0 .. u0 + 3 of a row (0 past its nunits units: zero-filled weights)
    __device__ static Side side4(const Row& row, int u0, int nunits) {
        const uint8_t* s = row.s + u0;
        if (u0 + 4 <= nunits && (reinterpret_cast<uintptr_t>(s) & 3u) == 0)
            return {__ldg(reinterpret_cast<const uint32_t*>(s))};
        uint32_t v = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (u0 + k < nunits) v |= uint32_t(__ldg(s + k)) << (8 * k);
        return {v};
    }
    // 2^(byte k of s - 127) as a float (k a constant after unrolling)
    __device__ static float unit_scale(uint32_t s, int k) {
        const uint32_t b = k == 0 ? s << 23 : k == 1 ? s << 15 : k == 2 ? s << 7 : s >> 1;
        return __uint_as_float(b & 0x7F800000u);
    }
    __device__ static float post(const KernelParams&, int, int, int) { return 1.f; }
};

// A layer of either format: decode steps through the e4m3 bytes under FTW_CUDA_FP4_MMA=fp8 | f16,
// else (and prefill) through the bf16 decode.
inline void launch_e8m0_fp4(const KernelParams& p, cudaStream_t stream) {
    launch_fp8_units<E8m0Fp4Fp8Decoder, E8m0Fp4Decoder>(p, stream);
}

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
