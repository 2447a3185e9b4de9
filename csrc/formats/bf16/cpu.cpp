// bf16 experts: gate_up [2I, H] bf16, down [H, I] bf16, optional bf16 biases.
#include "core/cpu_format.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

struct Bf16Decoder {
    struct Ctx {
        const uint16_t* w;
        int64_t K;
    };

    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        return {
            {"gate_up", {DType::BF16}, 2 * I * H},
            {"down", {DType::BF16}, H * I},
            {"gate_up_bias", {DType::BF16}, 2 * I, true},
            {"down_bias", {DType::BF16}, H, true},
        };
    }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        return {reinterpret_cast<const uint16_t*>(L.at(bank_name(p)).expert(e)), p == Proj::GateUp ? L.H : L.I};
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const uint16_t* w = c.w + r * c.K + k0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            if ((i & 31) == 0) simd::prefetch(w + i + simd::kPrefetchBytes / 2);
            simd::bf16x16(w + i, out + i);
        }
        for (; i < n; ++i) out[i] = num::bf16_to_f32(w[i]);
    }
};

}  // namespace

extern const FormatInfo kBf16 = {
    "bf16", [](const Options&) -> std::unique_ptr<Format> { return std::make_unique<ChunkedFormat<Bf16Decoder>>(Bf16Decoder{}); }};
FTW_CPU_FORMAT(kBf16);

}  // namespace ftw::cpu
