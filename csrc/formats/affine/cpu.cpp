// MLX affine experts: `bits`-bit unsigned values as an LSB-first bit stream per row (u32
// words), a scale and an offset (bf16/f16/f32) per group_size inputs: w = scale * q + offset.
#include <algorithm>
#include <cstring>

#include "core/cpu_format.h"
#include "core/format_registry.h"

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

    // One token. bits 4 with groups of 32k: fused (q . x per group, then scale; the offsets
    // meet the group sums of x, computed once per call in order_x after the reordered x).
    bool fused() const { return bits == 4 && group % 32 == 0; }

    void order_x(const float* x, int64_t K, float* out) const {
        if (fused()) simd::e2m1_order_x(x, K, out);
        else std::memcpy(out, x, size_t(K) * sizeof(float));
        for (int64_t g = 0; g < K / group; ++g) {
            float sum = 0.0f;
            for (int64_t i = g * group; i < (g + 1) * group; ++i) sum += x[i];
            out[K + g] = sum;
        }
    }

    float dot_row(const Ctx& c, int64_t r, const float* x, int64_t K) const {
        if (!fused()) {
            return dot_row_by_chunks(*this, c, r, x, K);
        }
        const int64_t groups = K / group, g0 = r * groups;
        float s[256], o[256];
        float sum = 0.0f;
        for (int64_t gb = 0; gb < groups; gb += 256) {
            const int64_t ng = std::min<int64_t>(256, groups - gb);
            for (int64_t g = 0; g < ng; ++g) {
                s[g] = load_float(c.s, c.sdt, g0 + gb + g);
                o[g] = load_float(c.o, c.odt, g0 + gb + g);
            }
            sum += simd::dot_u4_affine(c.w + r * (K / 2) + gb * group / 2, s, o, group, x + gb * group, x + K + gb, ng * group);
        }
        return sum;
    }

    // values [j0, j1) of a row (multiples of 8) -> q as floats. 8 values are `B` bytes: read
    // them as one little-endian word (8 bytes where the row has them, else exactly B).
    template <int B>
    static void unpack(const uint8_t* row, int64_t row_bytes, int64_t j0, int64_t j1, float* out) {
        constexpr uint64_t mask = (uint64_t(1) << B) - 1;
        for (int64_t j = j0; j < j1; j += 8) {
            const int64_t at = j * B / 8;
            uint64_t v = 0;
            if (at + 8 <= row_bytes) std::memcpy(&v, row + at, 8);
            else std::memcpy(&v, row + at, B);
            for (int i = 0; i < 8; ++i) out[j - j0 + i] = float((v >> (i * B)) & mask);
        }
    }

    void decode(const Ctx& c, int64_t r, int64_t k0, int64_t n, float* out) const {
        const int64_t row_bytes = c.K * bits / 8;
        const uint8_t* row = c.w + r * row_bytes;
        const int64_t g0 = r * (c.K / group);
        if (bits == 4 && group % 16 == 0) {  // the common MLX case: nibbles, 16 at a time
            for (int64_t j = 0; j < n;) {
                const int64_t gi = (k0 + j) / group, end = std::min(n, (gi + 1) * group - k0);
                const float s = load_float(c.s, c.sdt, g0 + gi), o = load_float(c.o, c.odt, g0 + gi);
                for (; j < end; j += 16) simd::u4x16(row + (k0 + j) / 2, s, o, out + j);
            }
            return;
        }
        switch (bits) {
            case 2: unpack<2>(row, row_bytes, k0, k0 + n, out); break;
            case 3: unpack<3>(row, row_bytes, k0, k0 + n, out); break;
            case 4: unpack<4>(row, row_bytes, k0, k0 + n, out); break;
            case 5: unpack<5>(row, row_bytes, k0, k0 + n, out); break;
            case 6: unpack<6>(row, row_bytes, k0, k0 + n, out); break;
            default: unpack<8>(row, row_bytes, k0, k0 + n, out); break;
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
FTW_CPU_FORMAT(kAffine);

}  // namespace ftw::cpu
