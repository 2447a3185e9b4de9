// What a CPU expert-format kernel is: an object built once per distinct (format, options) that
// multiplies rows of one expert's projection with a few input vectors, dequantizing inside the
// product. The executor (moe_executor.*) does routing, activation, biases and threads; each
// format folder (csrc/formats/<name>/cpu.cpp) supplies only its Format and FormatInfo.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "core/numerics.h"
#include "core/simd.h"

namespace ftw::cpu {

// The bank dtypes of docs/FORMAT.md that CPU kernels read.
enum class DType { BF16, F16, F32, F8E4M3, E8M0, U8, I8, U32 };

DType parse_dtype(const std::string& name);  // throws UnsupportedError for other names
const char* dtype_name(DType d);
int dtype_size(DType d);

// One bank of one layer: E expert rows of `expert_bytes` bytes each, `expert_stride` apart.
struct Bank {
    const uint8_t* data = nullptr;
    int64_t expert_stride = 0;
    int64_t expert_bytes = 0;
    DType dtype = DType::U8;
    bool present = false;  // false: the layer has no such bank (or an [E, 0] placeholder)

    const uint8_t* expert(int64_t e) const { return data + e * expert_stride; }
};

struct LayerBanks {
    int64_t E = 0, H = 0, I = 0;
    std::map<std::string, Bank> banks;

    bool has(const std::string& name) const {
        auto it = banks.find(name);
        return it != banks.end() && it->second.present;
    }
    const Bank& at(const std::string& name) const;  // throws FormatError naming the bank
};

// Format options, as the Python side normalizes them: ints and strings as text, lists as
// comma-separated text ("128,128").
using Options = std::map<std::string, std::string>;
int64_t option_int(const Options& o, const std::string& key, int64_t fallback);
std::vector<int64_t> option_ints(const Options& o, const std::string& key, std::vector<int64_t> fallback);
std::string option_str(const Options& o, const std::string& key, const std::string& fallback);

enum class Proj { GateUp, Down };  // gate_up rows [0, 2I) read H inputs, down rows [0, H) read I

// Y[t * ldy + (r - r0)] = sum_k W[r][k] * X[t * ldx + k] for r in [r0, r1), t < ntok.
struct MatmulArgs {
    int64_t expert;
    Proj proj;
    int64_t r0, r1;
    const float* X;
    int64_t ldx;
    int64_t ntok;  // at most kMaxTokens
    float* Y;
    int64_t ldy;
};

inline constexpr int64_t kMaxTokens = 64;  // tokens per matmul call (the executor splits)

// What a format reads from each bank, per expert, at given H and I: the executor checks every
// layer against it before anything is read, so a kernel never reads past a row.
struct BankNeed {
    std::string name;
    std::vector<DType> dtypes;  // accepted
    int64_t elements;           // per expert (bytes: x the bank's dtype size)
    bool optional = false;      // expert biases: present or not
};

class Format {
public:
    virtual ~Format() = default;
    virtual std::vector<BankNeed> needs(int64_t H, int64_t I) const = 0;
    virtual void matmul(const LayerBanks& L, const MatmulArgs& a) const = 0;
    // Rewrites the input vectors of a projection in place before it (DeepSeek-V4's e4m3
    // activation quantization); false where the format takes inputs as they are.
    virtual bool transforms_inputs() const { return false; }
    virtual void transform_inputs(float* X, int64_t ldx, int64_t ntok, int64_t K) const {}
};

struct FormatInfo {
    const char* name;                                          // ftw.formats' registry name
    std::unique_ptr<Format> (*make)(const Options& options);   // throws on bad options/types
};

using simd::dot;

// FormatError unless `value` (a dimension named `what`) is a multiple of m.
inline void require_multiple(const char* format, const char* what, int64_t value, int64_t m) {
    if (value % m)
        throw FormatError(std::string(format) + ": " + what + " = " + std::to_string(value) + " is not a multiple of " +
                          std::to_string(m));
}

// A float bank element (bias, scale) of dtype bf16 / f16 / f32 -> float32.
inline float load_float(const uint8_t* p, DType d, int64_t i) {
    switch (d) {
        case DType::BF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return num::bf16_to_f32(v); }
        case DType::F16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return num::f16_to_f32(v); }
        case DType::F32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
        default: throw FormatError(std::string("not a float bank dtype: ") + dtype_name(d));
    }
}

// The common kernel shape: a format describes how to decode values [k0, k0 + n) of row r of
// one expert's projection into floats (n <= kChunk, k0 a multiple of kChunk); this drives the
// product, decoding each chunk once for all tokens (never a whole expert in float). `Dec` has
//   Dec::Ctx bind(const LayerBanks&, int64_t expert, Proj) const;   // bank pointers, once a call
//   void decode(const Dec::Ctx&, int64_t r, int64_t k0, int64_t n, float* out) const;
//   std::vector<BankNeed> needs(int64_t H, int64_t I) const;
inline constexpr int64_t kChunk = 256;

// A decoder may also have a fused one-token row dot (decode steps, T = 1):
//   float dot_row(const Dec::Ctx&, int64_t r, const float* x, int64_t K) const;
// and an input order of its own for it (x reordered once per call, shared by all rows; out
// has room for 2K floats):
//   void order_x(const float* x, int64_t K, float* out) const;
template <class D, class = void>
struct has_dot_row : std::false_type {};
template <class D>
struct has_dot_row<D, std::void_t<decltype(&D::dot_row)>> : std::true_type {};
template <class D, class = void>
struct has_order_x : std::false_type {};
template <class D>
struct has_order_x<D, std::void_t<decltype(&D::order_x)>> : std::true_type {};

// Row r of a projection dotted with x through the decoder's chunks: the fallback of a fused
// dot_row for the layouts its vector path cannot step through.
template <class Dec>
float dot_row_by_chunks(const Dec& dec, const typename Dec::Ctx& c, int64_t r, const float* x, int64_t K) {
    alignas(64) float buf[kChunk];
    float sum = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t n = K - k0 < kChunk ? K - k0 : kChunk;
        dec.decode(c, r, k0, n, buf);
        sum += dot(buf, x + k0, n);
    }
    return sum;
}

template <class Dec>
void matmul_by_chunks(const Dec& dec, const LayerBanks& L, const MatmulArgs& a) {
    const int64_t K = a.proj == Proj::GateUp ? L.H : L.I;
    const auto ctx = dec.bind(L, a.expert, a.proj);
    if constexpr (has_dot_row<Dec>::value) {
        if (a.ntok == 1) {
            const float* x = a.X;
            if constexpr (has_order_x<Dec>::value) {
                thread_local std::vector<float> ordered;  // order_x may write up to 2K floats
                ordered.resize(size_t(2 * K));
                dec.order_x(a.X, K, ordered.data());
                x = ordered.data();
            }
            for (int64_t r = a.r0; r < a.r1; ++r) a.Y[r - a.r0] = dec.dot_row(ctx, r, x, K);
            return;
        }
    }
    alignas(64) float buf[kChunk];
    float acc[kMaxTokens];
    for (int64_t r = a.r0; r < a.r1; ++r) {
        for (int64_t t = 0; t < a.ntok; ++t) acc[t] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
            const int64_t n = K - k0 < kChunk ? K - k0 : kChunk;
            dec.decode(ctx, r, k0, n, buf);
            int64_t t = 0;
            for (; t + 4 <= a.ntok; t += 4) simd::dot4(buf, a.X + t * a.ldx + k0, a.ldx, n, acc + t);
            for (; t < a.ntok; ++t) acc[t] += dot(buf, a.X + t * a.ldx + k0, n);
        }
        for (int64_t t = 0; t < a.ntok; ++t) a.Y[t * a.ldy + (r - a.r0)] = acc[t];
    }
}

// bank names of a projection: "gate_up" + suffix or "down" + suffix
inline std::string bank_name(Proj p, const char* suffix = "") {
    return std::string(p == Proj::GateUp ? "gate_up" : "down") + suffix;
}

// A Format made of a chunk decoder (most formats): needs() and the decoder are the format's.
template <class Dec>
class ChunkedFormat : public Format {
public:
    explicit ChunkedFormat(Dec dec) : dec_(std::move(dec)) {}
    std::vector<BankNeed> needs(int64_t H, int64_t I) const override { return dec_.needs(H, I); }
    void matmul(const LayerBanks& L, const MatmulArgs& a) const override { matmul_by_chunks(dec_, L, a); }

protected:
    Dec dec_;
};

}  // namespace ftw::cpu
