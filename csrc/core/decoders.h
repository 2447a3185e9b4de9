// Chunk decoders shared by several formats (see matmul_by_chunks in cpu_format.h).
#pragma once

#include "core/cpu_format.h"

namespace ftw::cpu {

// e2m1 pairs (low nibble first) with one E8M0 scale per 32 values: mxfp4 and ds_fp4.
//   gate_up [2I, H/2] u8 (or i8: same bytes), gate_up_scale [2I, H/32] e8m0; down likewise.
struct Fp4E8m0Decoder {
    struct Ctx {
        const uint8_t* w;
        const uint8_t* s;
        int64_t K;
    };

    static std::vector<BankNeed> fp4_needs(int64_t H, int64_t I) {
        require_multiple("fp4", "H", H, 32);
        require_multiple("fp4", "I", I, 32);
        return {
            {"gate_up", {DType::U8, DType::I8}, 2 * I * H / 2},
            {"down", {DType::U8, DType::I8}, H * I / 2},
            {"gate_up_scale", {DType::E8M0, DType::U8}, 2 * I * H / 32},
            {"down_scale", {DType::E8M0, DType::U8}, H * I / 32},
        };
    }
    std::vector<BankNeed> needs(int64_t H, int64_t I) const { return fp4_needs(H, I); }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        return {L.at(bank_name(p)).expert(e), L.at(bank_name(p, "_scale")).expert(e),
                p == Proj::GateUp ? L.H : L.I};
    }

    void order_x(const float* x, int64_t K, float* out) const { simd::e2m1_order_x(x, K, out); }

    float dot_row(const Ctx& c, int64_t r, const float* x, int64_t K) const {
        const uint8_t* s = c.s + r * (K / 32);
        float scale[256];
        float sum = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += 32 * 256) {  // the scales of up to 8192 values at a time
            const int64_t n = K - k0 < 32 * 256 ? K - k0 : 32 * 256;
            simd::e8m0_to_f32(s + k0 / 32, n / 32, scale);
            sum += simd::dot_e2m1(c.w + r * (K / 2) + k0 / 2, scale, 32, x + k0, n);
        }
        return sum;
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const uint8_t* w = c.w + r * (c.K / 2) + k0 / 2;
        const uint8_t* s = c.s + r * (c.K / 32) + k0 / 32;
        for (int64_t b = 0; b < n / 32; ++b) {
            const float scale = num::kE8M0[s[b]];
            simd::e2m1x16(w + b * 16, scale, out + b * 32);
            simd::e2m1x16(w + b * 16 + 8, scale, out + b * 32 + 16);
        }
    }
};

}  // namespace ftw::cpu
