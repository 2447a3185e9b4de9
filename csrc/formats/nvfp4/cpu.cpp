// NVFP4 experts: e2m1 pairs (low nibble first), an e4m3 scale per 16 values and a float32
// global per row: w = e2m1 * e4m3(scale) * global[row].
#include "core/cpu_format.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

struct Nvfp4Decoder {
    struct Ctx {
        const uint8_t* w;
        const uint8_t* s;
        const float* g;
        int64_t K;
    };

    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        require_multiple("nvfp4", "H", H, 16);
        require_multiple("nvfp4", "I", I, 16);
        return {
            {"gate_up", {DType::U8}, 2 * I * H / 2},
            {"down", {DType::U8}, H * I / 2},
            {"gate_up_scale", {DType::F8E4M3, DType::U8}, 2 * I * H / 16},
            {"down_scale", {DType::F8E4M3, DType::U8}, H * I / 16},
            {"gate_up_global", {DType::F32}, 2 * I},
            {"down_global", {DType::F32}, H},
        };
    }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        return {L.at(bank_name(p)).expert(e), L.at(bank_name(p, "_scale")).expert(e),
                reinterpret_cast<const float*>(L.at(bank_name(p, "_global")).expert(e)),
                p == Proj::GateUp ? L.H : L.I};
    }

    void order_x(const float* x, int64_t K, float* out) const { simd::e2m1_order_x(x, K, out); }

    float dot_row(const Ctx& c, int64_t r, const float* x, int64_t K) const {
        const uint8_t* s = c.s + r * (K / 16);
        const float g = c.g[r];
        float scale[256];
        float sum = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += 16 * 256) {  // scales for up to 4096 values at a time
            const int64_t n = K - k0 < 16 * 256 ? K - k0 : 16 * 256;
            simd::e4m3_to_f32(s + k0 / 16, n / 16, g, scale);
            sum += simd::dot_e2m1(c.w + r * (K / 2) + k0 / 2, scale, 16, x + k0, n);
        }
        return sum;
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const uint8_t* w = c.w + r * (c.K / 2) + k0 / 2;
        const uint8_t* s = c.s + r * (c.K / 16) + k0 / 16;
        const float g = c.g[r];
        for (int64_t b = 0; b < n / 16; ++b) simd::e2m1x16(w + b * 8, num::kE4M3[s[b]] * g, out + b * 16);
    }
};

}  // namespace

extern const FormatInfo kNvfp4 = {
    "nvfp4", [](const Options&) -> std::unique_ptr<Format> { return std::make_unique<ChunkedFormat<Nvfp4Decoder>>(Nvfp4Decoder{}); }};
FTW_CPU_FORMAT(kNvfp4);

}  // namespace ftw::cpu
