// GGUF experts: raw ggml rows, a ggml type per projection (ggml_types.h has each type's block
// layout, decoder and dot product). gate_up holds gate's I rows then up's I rows; with one type
// it is [2I, row_bytes], with two it is one flat byte row (gate's rows' bytes, then up's).
// down is [H, row_bytes(I)]. Optional f32/f16 biases.
#include <algorithm>

#include "core/cpu_format.h"
#include "core/format_registry.h"
#include "formats/gguf/ggml_types.h"

namespace ftw::cpu {
namespace {

class Gguf : public Format {
public:
    Gguf(const ggml::TypeTraits& gate, const ggml::TypeTraits& up, const ggml::TypeTraits& down)
        : gate_(gate), up_(up), down_(down) {}

    std::vector<BankNeed> needs(int64_t H, int64_t I) const override {
        ggml::check_row(gate_, H, gate_.row_bytes(H), "gguf gate rows");
        ggml::check_row(up_, H, up_.row_bytes(H), "gguf up rows");
        ggml::check_row(down_, I, down_.row_bytes(I), "gguf down rows");
        return {
            {"gate_up", {DType::U8}, I * (gate_.row_bytes(H) + up_.row_bytes(H))},
            {"down", {DType::U8}, H * down_.row_bytes(I)},
            {"gate_up_bias", {DType::F32, DType::F16}, 2 * I, true},
            {"down_bias", {DType::F32, DType::F16}, H, true},
        };
    }

    void matmul(const LayerBanks& L, const MatmulArgs& a) const override {
        const Bank& bank = L.at(bank_name(a.proj));
        const uint8_t* base = bank.expert(a.expert);
        const int64_t K = a.proj == Proj::GateUp ? L.H : L.I;
        float tmp[kMaxTokens];
        if (a.ntok == 1) {  // one token: the type's multi-row dot (shares work across rows)
            for (int64_t r0 = a.r0; r0 < a.r1;) {
                const bool gate = a.proj == Proj::GateUp && r0 < L.I;
                const int64_t r1 = gate ? std::min(a.r1, L.I) : a.r1;
                const ggml::TypeTraits& t = a.proj == Proj::Down ? down_ : gate ? gate_ : up_;
                const int64_t rb = t.row_bytes(K);
                const uint8_t* row = a.proj == Proj::Down || gate ? base + r0 * rb
                                                                  : base + L.I * gate_.row_bytes(K) + (r0 - L.I) * rb;
                t.dot_rows(row, rb, r1 - r0, a.X, K, a.Y + (r0 - a.r0));
                r0 = r1;
            }
            return;
        }
        for (int64_t r = a.r0; r < a.r1; ++r) {
            const ggml::TypeTraits* t;
            const uint8_t* row;
            if (a.proj == Proj::Down) {
                t = &down_;
                row = base + r * down_.row_bytes(K);
            } else if (r < L.I) {
                t = &gate_;
                row = base + r * gate_.row_bytes(K);
            } else {
                t = &up_;
                row = base + L.I * gate_.row_bytes(K) + (r - L.I) * up_.row_bytes(K);
            }
            if (a.ntok == 1) {
                a.Y[r - a.r0] = t->dot(row, a.X, K);
            } else {
                t->dot_multi(row, a.X, a.ldx, a.ntok, K, tmp);
                for (int64_t i = 0; i < a.ntok; ++i) a.Y[i * a.ldy + (r - a.r0)] = tmp[i];
            }
        }
    }

private:
    const ggml::TypeTraits &gate_, &up_, &down_;
};

std::unique_ptr<Format> make(const Options& o) {
    const std::string gu = option_str(o, "gate_up_type", "");
    const std::string gate = option_str(o, "gate_type", gu), up = option_str(o, "up_type", gu);
    const std::string down = option_str(o, "down_type", "");
    if (gate.empty() || up.empty() || down.empty())
        throw FormatError("gguf: options need gate_up_type (or gate_type + up_type) and down_type");
    return std::make_unique<Gguf>(ggml::lookup(gate), ggml::lookup(up), ggml::lookup(down));
}

}  // namespace

extern const FormatInfo kGguf = {"gguf", make};
FTW_CPU_FORMAT(kGguf);

}  // namespace ftw::cpu
