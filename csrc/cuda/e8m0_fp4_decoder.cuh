// The decoder of the E8M0-scaled FP4 formats (mxfp4, ds_fp4): e2m1 pairs (low nibble first), one
// E8M0 scale per 32 inputs = one per 16-byte unit. e2m1 * 2^k is exact in bf16 for scales from
// 2^-64 to 2^63 (bytes 63..190; real checkpoints sit near 2^-10): the weights carry 2^-62, so a
// byte above 190 would overflow to inf and one below 63 lose bits to bf16 subnormals.
#pragma once

#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {

struct E8m0Fp4Decoder {
    static constexpr int VEC = 32;
    struct Row {
        const uint4* w;
        const uint8_t* s;
    };
    struct Raw {
        uint4 w;
        uint32_t s;
    };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int in = proj == 0 ? p.H : p.I;
        return {reinterpret_cast<const uint4*>(bank_row(p, proj, slot) + int64_t(r) * (in / 2)),
                bank_row(p, 2 + proj, slot) + int64_t(r) * (in / 32)};
    }
    __device__ static Raw load(const Row& row, int u) { return {ld_stream(row.w + u), __ldg(row.s + u)}; }
    static constexpr bool kStaged = true;  // decode: experts_decode_staged (units through shared memory)
    struct Side {
        uint32_t s;
    };
    __device__ static const uint8_t* weights(const KernelParams& p, int proj, int slot) { return bank_row(p, proj, slot); }
    __device__ static int64_t weight_row_bytes(const KernelParams& p, int proj) {
        const int in = proj == 0 ? p.H : p.I;
        return int64_t(in / 2);
    }
    __device__ static Side side(const Row& row, int u) { return {__ldg(row.s + u)}; }
    __device__ static Raw raw(const uint4& w, const Side& s) { return {w, s.s}; }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t m = e8m0_bf16(raw.s, 64);  // 2^(s-127) * 2^64: with e2m1's 2^-126, w * 2^-62
        const uint32_t m2 = m | (m << 16);
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t v[4];
            e2m1x8_raw(q[i], v);
#pragma unroll
            for (int k = 0; k < 4; ++k) w[4 * i + k] = hmul2(v[k], m2);
        }
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_fp4(x, a); }
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
