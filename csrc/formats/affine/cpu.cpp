// MLX affine experts: `bits`-bit unsigned values as an LSB-first bit stream per row (u32
// words), a scale and an offset (bf16/f16/f32) per group_size inputs: w = scale * q + offset.
#include <algorithm>
#include <cstring>

#include "core/cpu_format.h"

namespace ftw::cpu {
namespace {

struct AffineDecoder {
    int64_t bits, group;

    struct Ctx {
        const uint8_t* w;
        const uint8_t* s;
        const uint8_t* o;
        DType sdt, odt;
        int64_t K;
    };

    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        const std::vector<DType> fd = {DType::BF16, DType::F16, DType::F32};
        require_multiple("affine", "H", H, group);
        require_multiple("affine", "I", I, group);
        return {
            {"gate_up", {DType::U32}, 2 * I * H * bits / 32},
            {"down", {DType::U32}, H * I * bits / 32},
            {"gate_up_scale", fd, 2 * I * H / group},
            {"down_scale", fd, H * I / group},
            {"gate_up_offset", fd, 2 * I * H / group},
            {"down_offset", fd, H * I / group},
        };
    }

    Ctx bind(const LayerBanks& L, int64_t e, Proj p) const {
        const Bank& s = L.at(bank_name(p, "_scale"));
        const Bank& o = L.at(bank_name(p, "_offset"));
        return {L.at(bank_name(p)).expert(e), s.expert(e), o.expert(e), s.dtype, o.dtype, p == Proj::GateUp ? L.H : L.I};
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        // 8 values are `bits` bytes: read them into a 64-bit word (little-endian) and shift
        const uint8_t* w = c.w + r * (c.K * bits / 8) + k0 * bits / 8;
        const uint64_t mask = (uint64_t(1) << bits) - 1;
        const int64_t g0 = r * (c.K / group);
        for (int64_t j = 0; j < n; j += 8) {
            uint64_t v = 0;
            std::memcpy(&v, w + j * bits / 8, size_t(bits));
            for (int i = 0; i < 8; ++i) out[j + i] = float((v >> (i * bits)) & mask);
        }
        for (int64_t j = 0; j < n;) {
            const int64_t gi = (k0 + j) / group, end = std::min(n, (gi + 1) * group - k0);
            const float s = load_float(c.s, c.sdt, g0 + gi), o = load_float(c.o, c.odt, g0 + gi);
            for (; j < end; ++j) out[j] = out[j] * s + o;
        }
    }
};

std::unique_ptr<Format> make(const Options& opts) {
    const int64_t bits = option_int(opts, "bits", 0), group = option_int(opts, "group_size", 0);
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        throw FormatError("affine: bits must be 2, 3, 4, 5, 6 or 8, got " + std::to_string(bits));
    if (group <= 0 || group % 8) throw FormatError("affine: group_size must be a positive multiple of 8, got " + std::to_string(group));
    return std::make_unique<ChunkedFormat<AffineDecoder>>(AffineDecoder{bits, group});
}

}  // namespace

extern const FormatInfo kAffine = {"affine", make};

}  // namespace ftw::cpu
