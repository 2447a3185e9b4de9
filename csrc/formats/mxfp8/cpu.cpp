// MXFP8 experts: e4m3 weights with an E8M0 scale per 32 values along the input.
#include "core/cpu_format.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

struct Mxfp8Decoder {
    struct Ctx {
        const uint8_t* w;
        const uint8_t* s;
        int64_t K;
    };

    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        require_multiple("mxfp8", "H", H, 32);
        require_multiple("mxfp8", "I", I, 32);
        return {
            {"gate_up", {DType::F8E4M3, DType::U8}, 2 * I * H},
            {"down", {DType::F8E4M3, DType::U8}, H * I},
            {"gate_up_scale", {DType::E8M0, DType::U8}, 2 * I * H / 32},
            {"down_scale", {DType::E8M0, DType::U8}, H * I / 32},
        };
    }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        return {L.at(bank_name(p)).expert(e), L.at(bank_name(p, "_scale")).expert(e), p == Proj::GateUp ? L.H : L.I};
    }

    float dot_row(const Ctx& c, int64_t r, const float* x, int64_t K) const {
        const uint8_t* s = c.s + r * (K / 32);
        float scale[256];
        float sum = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += 32 * 256) {
            const int64_t n = K - k0 < 32 * 256 ? K - k0 : 32 * 256;
            simd::e8m0_to_f32(s + k0 / 32, n / 32, scale);
            sum += simd::dot_e4m3(c.w + r * K + k0, scale, 32, x + k0, n);
        }
        return sum;
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const uint8_t* w = c.w + r * c.K + k0;
        const uint8_t* s = c.s + r * (c.K / 32) + k0 / 32;
        for (int64_t b = 0; b < n / 32; ++b) {
            const float scale = num::kE8M0[s[b]];
            simd::e4m3x16(w + b * 32, scale, out + b * 32);
            simd::e4m3x16(w + b * 32 + 16, scale, out + b * 32 + 16);
        }
    }
};

}  // namespace

extern const FormatInfo kMxfp8 = {
    "mxfp8", [](const Options&) -> std::unique_ptr<Format> { return std::make_unique<ChunkedFormat<Mxfp8Decoder>>(Mxfp8Decoder{}); }};
FTW_CPU_FORMAT(kMxfp8);

}  // namespace ftw::cpu
