// Block FP8 experts: e4m3 weights, one scale (f32 or bf16) per [bo, bi] block:
//   gate_up [2I, H], gate_up_scale [2 ceil(I/bo), ceil(H/bi)]  (gate's scale rows, then up's);
//   down [H, I], down_scale [ceil(H/bo), ceil(I/bi)].
// Row r of gate_up uses scale row r / bo when r < I, else ceil(I/bo) + (r - I) / bo.
#include <algorithm>

#include "core/cpu_format.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Fp8BlockDecoder {
    int64_t bo, bi;

    struct Ctx {
        const uint8_t* w;
        const uint8_t* s;
        DType sdt;
        int64_t K, scols, I;
        bool gate_up;
    };

    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        const std::vector<DType> sd = {DType::F32, DType::BF16};
        return {
            {"gate_up", {DType::F8E4M3, DType::U8}, 2 * I * H},
            {"down", {DType::F8E4M3, DType::U8}, H * I},
            {"gate_up_scale", sd, 2 * cdiv(I, bo) * cdiv(H, bi)},
            {"down_scale", sd, cdiv(H, bo) * cdiv(I, bi)},
        };
    }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        const Bank& s = L.at(bank_name(p, "_scale"));
        const int64_t K = p == Proj::GateUp ? L.H : L.I;
        return {L.at(bank_name(p)).expert(e), s.expert(e), s.dtype, K, cdiv(K, bi), L.I, p == Proj::GateUp};
    }

    float dot_row(const Ctx& c, int64_t r, const float* x, int64_t K) const {
        if (bi % 16 || K % 16) {  // blocks the vector kernel cannot step through: chunk by chunk
            return dot_row_by_chunks(*this, c, r, x, K);
        }
        const int64_t srow = !c.gate_up || r < c.I ? r / bo : cdiv(c.I, bo) + (r - c.I) / bo;
        float scale[256];
        float sum = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += 256 * bi) {
            const int64_t n = std::min(256 * bi, K - k0);
            for (int64_t b = 0; b < cdiv(n, bi); ++b) scale[b] = load_float(c.s, c.sdt, srow * c.scols + k0 / bi + b);
            sum += simd::dot_e4m3(c.w + r * K + k0, scale, bi, x + k0, n);
        }
        return sum;
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const int64_t srow = !c.gate_up || r < c.I ? r / bo : cdiv(c.I, bo) + (r - c.I) / bo;
        const uint8_t* w = c.w + r * c.K;
        for (int64_t j = k0; j < k0 + n;) {
            const int64_t end = std::min(k0 + n, (j / bi + 1) * bi);
            const float s = load_float(c.s, c.sdt, srow * c.scols + j / bi);
            for (; j + 16 <= end; j += 16) simd::e4m3x16(w + j, s, out + (j - k0));
            for (; j < end; ++j) out[j - k0] = num::kE4M3[w[j]] * s;
        }
    }
};

std::unique_ptr<Format> make(const Options& o) {
    auto bs = option_ints(o, "block_size", {128, 128});
    if (bs.size() != 2 || bs[0] <= 0 || bs[1] <= 0) throw FormatError("fp8_block: block_size must be two positive integers");
    return std::make_unique<ChunkedFormat<Fp8BlockDecoder>>(Fp8BlockDecoder{bs[0], bs[1]});
}

}  // namespace

extern const FormatInfo kFp8Block = {"fp8_block", make};
FTW_CPU_FORMAT(kFp8Block);

}  // namespace ftw::cpu
