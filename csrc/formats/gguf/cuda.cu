// GGUF experts on the GPU: raw ggml rows, a ggml type per projection (gate, up, down), read from
// the slots as the file stores them. One decoder serves every type: a 32-value unit of a row is
// one sub-block of its ggml block (a whole block for the 32-value types, one eighth of a 256-value
// K/IQ super-block), and the unit's 32 floats are computed exactly as ggml's dequantize_row_*
// does (bit-exact float32: products rounded in ggml's order, no FMA contraction), then rounded to
// bf16 for the tensor cores. The type is a value of the row (a layer's gate, up and down may
// differ), so one kernel instantiation covers every type pair; the per-type work is one switch,
// generated from the one type list below (FTW_GGML_CUDA_TYPES). Q4_K alone also has a decoder
// of its own (below), used where a projection's rows are all Q4_K.
//
// Numerics: a bf16 weight is within 2^-9 of ggml's float32 value (relative), unlike the other
// formats whose decoded values are exact in bf16; the error of a dot product averages out to a
// few 1e-3 relative (tests/test_cuda_kernels_gguf.py states the tolerance).
//
// Loads: a ggml block is not 16-byte aligned in general (Q8_0: 34 bytes, MXFP4: 17), so the
// decoder reads 32-bit words at any byte address (two aligned loads and a funnel shift) through
// the read-only cache; the unit's load is deferred to decode (Raw is the block's address), which
// keeps registers low for the largest types (Q6_K reads 64 bytes for 32 values). Q4_K, whose
// 144-byte blocks keep 16-byte alignment, has its own decoder that loads a ring stage ahead
// (Q4KDecoder, ~1.5x); the launch picks a decoder per projection.
#include <string>
#include <vector>

#include "core/errors.h"
#include "cuda/experts.h"
#include "cuda/experts_kernels.cuh"

// the grids and value tables in global memory read through the L1 (lanes index them divergently,
// which constant memory would serialise)
#define FTW_GGML_TABLE static __device__ __align__(16) const
#include "ggml_tables.h"

namespace ftw::cuda {
namespace {

namespace tb = ::ftw::ggml::tables;

// The types with a CUDA decoder, most common first: the one list (host table and device switch).
#define FTW_GGML_CUDA_TYPES(X)                                                                       \
    X(Q8_0) X(Q4_K) X(Q6_K) X(Q5_K) X(Q4_0) X(MXFP4) X(IQ4_NL) X(IQ4_XS) X(Q5_0) X(Q4_1) X(Q5_1)   \
    X(Q2_K) X(Q3_K) X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ3_S)

// ---- loads ----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t ld8(const uint8_t* p) { return __ldg(p); }

// 4 bytes at any address (little-endian); never reads past the 4-byte word holding p[3]
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t sh = uint32_t(a & 3) * 8;
    const uint32_t lo = __ldg(w);
    if (sh == 0) return lo;
    return __funnelshift_r(lo, __ldg(w + 1), sh);
}

__device__ __forceinline__ uint32_t ld16(const uint8_t* p) { return ld8(p) | ld8(p + 1) << 8; }

__device__ __forceinline__ float half_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(ld16(p))));
}

template <int N>
__device__ __forceinline__ void ld_words(const uint8_t* p, uint32_t (&w)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = ld32(p + 4 * i);
}

__device__ __forceinline__ uint32_t byte_of(const uint32_t* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu; }

// ggml's float order: a * b rounded, then + c rounded (nvcc would fuse a * b + c otherwise)
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }
__device__ __forceinline__ float mul_sub(float a, float b, float c) { return __fsub_rn(__fmul_rn(a, b), c); }

__device__ __forceinline__ float sign_of(uint32_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }

// ggml_e8m0_to_fp32_half: 2^(e-127) / 2
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// ---- one struct per type: sub(b, s, y) writes values 32s..32s+31 of the block at b ----------
// Layout comments as in ggml_types.cpp (byte offsets in one block).

// d:f16 | qs:int8[32]
struct Q8_0 {
    static constexpr tb::Size size = tb::size::Q8_0;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b);
        uint32_t q[8];
        ld_words(b + 2, q);
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = float(int8_t(byte_of(q, j))) * d;
    }
};

// 16 bytes of nibbles: value j low nibble of byte j, value j+16 high nibble
template <class F>
__device__ __forceinline__ void nibbles16(const uint8_t* qs, float (&y)[32], F f) {
    uint32_t q[4];
    ld_words(qs, q);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const uint32_t v = byte_of(q, j);
        y[j] = f(j, v & 15);
        y[j + 16] = f(j + 16, v >> 4);
    }
}

// d:f16 | qs[16]; value = d * (q - 8)
struct Q4_0 {
    static constexpr tb::Size size = tb::size::Q4_0;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b);
        nibbles16(b + 2, y, [&](int, uint32_t q) { return d * float(int(q) - 8); });
    }
};

// d:f16 | m:f16 | qs[16]; value = d * q + m
struct Q4_1 {
    static constexpr tb::Size size = tb::size::Q4_1;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b), m = half_at(b + 2);
        nibbles16(b + 4, y, [&](int, uint32_t q) { return mul_add(d, float(q), m); });
    }
};

// d:f16 | qh:u32 (bit j = 5th bit of value j) | qs[16]; value = d * (q - 16)
struct Q5_0 {
    static constexpr tb::Size size = tb::size::Q5_0;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b);
        const uint32_t qh = ld32(b + 2);
        nibbles16(b + 6, y, [&](int j, uint32_t q) { return d * float(int(q | ((qh >> j) & 1) << 4) - 16); });
    }
};

// d:f16 | m:f16 | qh:u32 | qs[16]; value = d * q + m
struct Q5_1 {
    static constexpr tb::Size size = tb::size::Q5_1;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b), m = half_at(b + 2);
        const uint32_t qh = ld32(b + 4);
        nibbles16(b + 8, y, [&](int j, uint32_t q) { return mul_add(d, float(q | ((qh >> j) & 1) << 4), m); });
    }
};

// d:f16 | qs[16] (nibbles as Q4_0) -> non-linear levels
struct IQ4_NL {
    static constexpr tb::Size size = tb::size::IQ4_NL;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = half_at(b);
        nibbles16(b + 2, y, [&](int, uint32_t q) { return d * float(tb::iq4nl_values[q]); });
    }
};

// e:e8m0 | qs[16] (nibbles as Q4_0) -> e2m1 values (doubled; the scale is halved to match)
struct MXFP4 {
    static constexpr tb::Size size = tb::size::MXFP4;
    __device__ static void sub(const uint8_t* b, int, float (&y)[32]) {
        const float d = e8m0_half(ld8(b));
        nibbles16(b + 1, y, [&](int, uint32_t q) { return d * float(tb::mxfp4_values[q]); });
    }
};

// scales[16] (low nibble scale, high nibble min, per 16 values) | qs[64] | d:f16 | dmin:f16.
// Value v = 128h + 32s + l is bits 2s..2s+1 of qs[32h + l].
struct Q2_K {
    static constexpr tb::Size size = tb::size::Q2_K;
    __device__ static void sub(const uint8_t* b, int u, float (&y)[32]) {
        const int h = u >> 2, s = u & 3;
        const float d = half_at(b + 80), dmin = half_at(b + 82);
        uint32_t q[8];
        ld_words(b + 16 + 32 * h, q);
#pragma unroll
        for (int half16 = 0; half16 < 2; ++half16) {
            const uint32_t sc = ld8(b + 8 * h + 2 * s + half16);
            const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
#pragma unroll
            for (int l = 0; l < 16; ++l)
                y[16 * half16 + l] = mul_sub(dl, float((byte_of(q, 16 * half16 + l) >> (2 * s)) & 3), ml);
        }
    }
};

// hmask[32] | qs[64] | scales[12] (16 6-bit scales, offset 32) | d:f16.
// Value v: low 2 bits as Q2_K; bit v/32 of hmask[v%32] clear means "minus 4".
struct Q3_K {
    static constexpr tb::Size size = tb::size::Q3_K;
    __device__ static void sub(const uint8_t* b, int u, float (&y)[32]) {
        const int h = u >> 2, s4 = u & 3;
        const float d = half_at(b + 108);
        uint32_t q[8], hm[8];
        ld_words(b + 32 + 32 * h, q);
        ld_words(b, hm);
#pragma unroll
        for (int half16 = 0; half16 < 2; ++half16) {
            const int i = 8 * h + 2 * s4 + half16;  // scale index (16 values each)
            const uint32_t lo = i < 8 ? ld8(b + 96 + i) & 15 : ld8(b + 96 + i - 8) >> 4;
            const uint32_t hi = (ld8(b + 104 + i % 4) >> (2 * (i / 4))) & 3;
            const float dl = d * float(int8_t(int(lo | hi << 4) - 32));
#pragma unroll
            for (int l0 = 0; l0 < 16; ++l0) {
                const int l = 16 * half16 + l0;
                const int qv = int((byte_of(q, l) >> (2 * s4)) & 3) - 4 + 4 * int((byte_of(hm, l) >> (4 * h + s4)) & 1);
                y[l] = dl * float(qv);
            }
        }
    }
};

// The 6-bit (scale, min) of sub-block j of Q4_K / Q5_K, packed in 12 bytes at s.
__device__ __forceinline__ void k4_scale_min(const uint8_t* s, int j, uint32_t& sc, uint32_t& mn) {
    if (j < 4) {
        sc = ld8(s + j) & 63;
        mn = ld8(s + j + 4) & 63;
    } else {
        sc = (ld8(s + j + 4) & 15) | ((ld8(s + j - 4) >> 2) & 0x30);
        mn = (ld8(s + j + 4) >> 4) | ((ld8(s + j) >> 2) & 0x30);
    }
}

// d:f16 | dmin:f16 | scales[12] | qs[128]: sub-block 2c (2c+1) is the low (high) nibbles of
// qs[32c..32c+32); value = d*sc * q - dmin*m
struct Q4_K {
    static constexpr tb::Size size = tb::size::Q4_K;
    __device__ static void sub(const uint8_t* b, int j, float (&y)[32]) {
        const float d = half_at(b), dmin = half_at(b + 2);
        uint32_t sc, mn;
        k4_scale_min(b + 4, j, sc, mn);
        const float d1 = d * float(sc), m1 = dmin * float(mn);
        uint32_t q[8];
        ld_words(b + 16 + 32 * (j >> 1), q);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) y[l] = mul_sub(d1, float((byte_of(q, l) >> shift) & 15), m1);
    }
};

// d | dmin | scales[12] | qh[32] (bit j of qh[l] = 5th bit of value 32j+l) | qs[128] as Q4_K
struct Q5_K {
    static constexpr tb::Size size = tb::size::Q5_K;
    __device__ static void sub(const uint8_t* b, int j, float (&y)[32]) {
        const float d = half_at(b), dmin = half_at(b + 2);
        uint32_t sc, mn;
        k4_scale_min(b + 4, j, sc, mn);
        const float d1 = d * float(sc), m1 = dmin * float(mn);
        uint32_t q[8], qh[8];
        ld_words(b + 48 + 32 * (j >> 1), q);
        ld_words(b + 16, qh);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const uint32_t v = ((byte_of(q, l) >> shift) & 15) | ((byte_of(qh, l) >> j) & 1) << 4;
            y[l] = mul_sub(d1, float(v), m1);
        }
    }
};

// ql[128] | qh[64] | scales:int8[16] (per 16 values) | d:f16. Value v = 128h + 32s + l:
// low nibble (s/2) of ql[64h + 32(s%2) + l], high bits 2s..2s+1 of qh[32h + l]; minus 32.
struct Q6_K {
    static constexpr tb::Size size = tb::size::Q6_K;
    __device__ static void sub(const uint8_t* b, int u, float (&y)[32]) {
        const int h = u >> 2, s = u & 3;
        const float d = half_at(b + 208);
        const int i0 = 8 * h + 2 * s;  // scale of values 0..15 of the unit; i0 + 1 of 16..31
        const float d0 = d * float(int8_t(ld8(b + 192 + i0))), d1 = d * float(int8_t(ld8(b + 193 + i0)));
        uint32_t ql[8], qh[8];
        ld_words(b + 64 * h + 32 * (s & 1), ql);
        ld_words(b + 128 + 32 * h, qh);
        const int shift = 4 * (s >> 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = int(((byte_of(ql, l) >> shift) & 15) | ((byte_of(qh, l) >> (2 * s)) & 3) << 4) - 32;
            y[l] = (l < 16 ? d0 : d1) * float(q);
        }
    }
};

// d:f16 | scales_h:u16 (2 bits per sub-block) | scales_l[4] (nibbles) | qs[128] (16 per
// sub-block of 32, nibbles as IQ4_NL); sub-block scale = d * (6-bit - 32)
struct IQ4_XS {
    static constexpr tb::Size size = tb::size::IQ4_XS;
    __device__ static void sub(const uint8_t* b, int j, float (&y)[32]) {
        const float d = half_at(b);
        const uint32_t sh = ld16(b + 2);
        const int s = int(((ld8(b + 4 + j / 2) >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4);
        const float dl = d * float(s - 32);
        nibbles16(b + 8 + 16 * j, y, [&](int, uint32_t q) { return dl * float(tb::iq4nl_values[q]); });
    }
};

// 8 grid magnitudes (a row of a grid of 8-byte rows) with the signs of `signs`, times db
__device__ __forceinline__ void grid8(const uint8_t* g, uint32_t signs, float db, float* y) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(g));
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = db * float(((j < 4 ? v.x : v.y) >> (8 * (j & 3))) & 0xFF) * sign_of(signs, j);
}

// d:f16 | per sub-block of 32: u32 of 4 grid indices, u32 of 4x7 sign bits + 4-bit scale
struct IQ2_XXS {
    static constexpr tb::Size size = tb::size::IQ2_XXS;
    __device__ static void sub(const uint8_t* b, int ib, float (&y)[32]) {
        const float d = half_at(b);
        const uint32_t a0 = ld32(b + 2 + 8 * ib), a1 = ld32(b + 6 + 8 * ib);
        const float db = d * (0.5f + float(a1 >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; ++l)
            grid8(tb::iq2xxs_grid[(a0 >> (8 * l)) & 255], __ldg(&tb::ksigns[(a1 >> (7 * l)) & 127]), db, y + 8 * l);
    }
};

// d:f16 | qs:u16[32] (9-bit grid index, 7-bit sign index) | scales[8] (a nibble per 16 values)
struct IQ2_XS {
    static constexpr tb::Size size = tb::size::IQ2_XS;
    __device__ static void sub(const uint8_t* b, int ib, float (&y)[32]) {
        const float d = half_at(b);
        const uint32_t sc = ld8(b + 66 + ib);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t q = ld16(b + 2 + 8 * ib + 2 * k);
            const float db = d * (0.5f + float((sc >> (4 * (k / 2))) & 15)) * 0.25f;
            grid8(tb::iq2xs_grid[q & 511], __ldg(&tb::ksigns[q >> 9]), db, y + 8 * k);
        }
    }
};

// d:f16 | qs[64] (grid index per 4 values) | per sub-block of 32: u32 of 4x7 sign bits + scale
struct IQ3_XXS {
    static constexpr tb::Size size = tb::size::IQ3_XXS;
    __device__ static void sub(const uint8_t* b, int ib, float (&y)[32]) {
        const float d = half_at(b);
        const uint32_t s = ld32(b + 66 + 4 * ib);
        const float db = d * (0.5f + float(s >> 28)) * 0.5f;
        uint32_t qs[2];
        ld_words(b + 2 + 8 * ib, qs);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t signs = __ldg(&tb::ksigns[(s >> (7 * l)) & 127]);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const uint32_t g = __ldg(reinterpret_cast<const uint32_t*>(tb::iq3xxs_grid[byte_of(qs, 2 * l + k)]));
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    y[8 * l + 4 * k + j] = db * float((g >> (8 * j)) & 0xFF) * sign_of(signs, 4 * k + j);
            }
        }
    }
};

// d:f16 | qs[64] | qh[8] (9th index bit) | signs[32] (one bit per value) | scales[4] (nibbles)
struct IQ3_S {
    static constexpr tb::Size size = tb::size::IQ3_S;
    __device__ static void sub(const uint8_t* b, int ib, float (&y)[32]) {
        const float d = half_at(b);
        const float db = d * float(1 + 2 * int((ld8(b + 106 + ib / 2) >> (4 * (ib % 2))) & 15));
        const uint32_t qh = ld8(b + 66 + ib);
        const uint32_t sg = ld32(b + 74 + 4 * ib);  // the sub-block's 32 sign bits
        uint32_t qs[2];
        ld_words(b + 2 + 8 * ib, qs);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t idx = byte_of(qs, k) | ((qh >> k) & 1) << 8;
            const uint32_t g = __ldg(reinterpret_cast<const uint32_t*>(tb::iq3s_grid[idx]));
#pragma unroll
            for (int j = 0; j < 4; ++j) y[4 * k + j] = db * float((g >> (8 * j)) & 0xFF) * sign_of(sg, 4 * k + j);
        }
    }
};

// ---- the decoder the kernels use --------------------------------------------------------------

// Where unit u (values 32u..32u+31) of a row of ggml type `type` lies: its block and the unit's
// index in the block (block nullptr for a type without a decoder).
struct Unit {
    const uint8_t* block;
    int sub;
};

__device__ __forceinline__ Unit locate(int type, const uint8_t* row, int u) {
    switch (type) {
#define FTW_GGML_CASE(T)                                                                        \
    case T::size.id: {                                                                          \
        constexpr int per = T::size.block_values / 32;                                          \
        return {row + int64_t(u / per) * T::size.block_bytes, u % per};                         \
    }
        FTW_GGML_CUDA_TYPES(FTW_GGML_CASE)
#undef FTW_GGML_CASE
        default: return {nullptr, 0};
    }
}

// the unit's 32 values, bit-exact to ggml's float32 ones
__device__ __forceinline__ void decode_unit(int type, const Unit& unit, float (&y)[32]) {
    switch (type) {
#define FTW_GGML_CASE(T)               \
    case T::size.id:                   \
        T::sub(unit.block, unit.sub, y); \
        return;
        FTW_GGML_CUDA_TYPES(FTW_GGML_CASE)
#undef FTW_GGML_CASE
        default:  // refused on the host before launch; zeros rather than garbage if ever reached
#pragma unroll
            for (int j = 0; j < 32; ++j) y[j] = 0.f;
    }
}

// bytes of a row of n values of a type (host and device)
__host__ __device__ __forceinline__ int64_t row_bytes_of(int type, int64_t n) {
    switch (type) {
#define FTW_GGML_CASE(T) \
    case T::size.id: return n / T::size.block_values * T::size.block_bytes;
        FTW_GGML_CUDA_TYPES(FTW_GGML_CASE)
#undef FTW_GGML_CASE
        default: return 0;
    }
}

struct GgmlDecoder {
    static constexpr int VEC = 32;
    struct Row {
        const uint8_t* p;
        int type;
    };
    struct Raw {
        Unit unit;
        int type;
    };
    // gate_up: gate's I rows then up's I rows (each in its own type); down: H rows
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const uint8_t* base = bank_row(p, proj, slot);
        if (proj == 1) return {base + int64_t(r) * row_bytes_of(p.ggml_type[2], p.I), p.ggml_type[2]};
        if (r < p.I) return {base + int64_t(r) * row_bytes_of(p.ggml_type[0], p.H), p.ggml_type[0]};
        const int64_t gate_bytes = int64_t(p.I) * row_bytes_of(p.ggml_type[0], p.H);
        return {base + gate_bytes + int64_t(r - p.I) * row_bytes_of(p.ggml_type[1], p.H), p.ggml_type[1]};
    }
    // Only locates the unit: its bytes are read in decode (a Raw holding them would cost every
    // type the largest one's registers). Prefetching the block into L2 here was measured no
    // faster on the H200 (docs/BENCHMARKS.md), so there is none.
    __device__ static Raw load(const Row& row, int u) { return {locate(row.type, row.p, u), row.type}; }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        float y[32];
        decode_unit(raw.type, raw.unit, y);
#pragma unroll
        for (int i = 0; i < 16; ++i) w[i] = pack_bf16x2(y[2 * i], y[2 * i + 1]);
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_identity(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return 1.0f; }
};

// Q4_K rows whose blocks sit on 16-byte boundaries (144-byte blocks: whenever the bank base and
// slot stride are 16-byte aligned, as the pools make them): the unit's bytes are loaded a ring
// stage ahead as three 16-byte vectors (the block's d, dmin and 12 scale bytes; the 32 bytes of
// nibbles of its sub-block pair), and decoded from registers. The same values as Q4_K::sub.
struct Q4KDecoder {
    static constexpr int VEC = 32;
    using Row = GgmlDecoder::Row;
    struct Raw {
        uint4 head, q0, q1;
        int j;  // the unit's sub-block in its block
    };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) { return GgmlDecoder::row(p, proj, slot, r); }
    __device__ static Raw load(const Row& row, int u) {
        const uint8_t* b = row.p + int64_t(u >> 3) * Q4_K::size.block_bytes;
        const int j = u & 7;
        const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (j >> 1));
        return {__ldg(reinterpret_cast<const uint4*>(b)), ld_stream(q), ld_stream(q + 1), j};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint4 h = raw.head;
        const int j = raw.j;
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
        auto sb = [&](int i) {  // scale byte i (0..11): bytes 4..15 of the block
            const uint32_t v = i < 4 ? h.y : (i < 8 ? h.z : h.w);
            return (v >> (8 * (i & 3))) & 0xFFu;
        };
        uint32_t sc, mn;
        if (j < 4) {
            sc = sb(j) & 63;
            mn = sb(j + 4) & 63;
        } else {
            sc = (sb(j + 4) & 15) | ((sb(j - 4) >> 2) & 0x30);
            mn = (sb(j + 4) >> 4) | ((sb(j) >> 2) & 0x30);
        }
        const float d1 = d * float(sc), m1 = dmin * float(mn);
        const uint32_t q[8] = {raw.q0.x, raw.q0.y, raw.q0.z, raw.q0.w, raw.q1.x, raw.q1.y, raw.q1.z, raw.q1.w};
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const float a = mul_sub(d1, float((byte_of(q, 2 * i) >> shift) & 15), m1);
            const float c = mul_sub(d1, float((byte_of(q, 2 * i + 1) >> shift) & 15), m1);
            w[i] = pack_bf16x2(a, c);
        }
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) { permute_identity(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return 1.0f; }
};

// The launch: a projection of Q4_K rows (gate and up both, or down) on 16-byte boundaries takes
// Q4KDecoder, everything else the table-driven GgmlDecoder.
void launch(const KernelParams& p, cudaStream_t stream) {
    constexpr int q4k = Q4_K::size.id;
    auto aligned = [&](int bank) { return reinterpret_cast<uintptr_t>(p.bank[bank]) % 16 == 0 && p.row_bytes[bank] % 16 == 0; };
    const bool gu = p.ggml_type[0] == q4k && p.ggml_type[1] == q4k && aligned(0);
    const bool dn = p.ggml_type[2] == q4k && aligned(1);
    if (gu && dn)
        launch_experts<Q4KDecoder, Q4KDecoder>(p, stream);
    else if (gu)
        launch_experts<Q4KDecoder, GgmlDecoder>(p, stream);
    else if (dn)
        launch_experts<GgmlDecoder, Q4KDecoder>(p, stream);
    else
        launch_experts<GgmlDecoder, GgmlDecoder>(p, stream);
}

struct HostType {
    const char* name;
    int id, block_values;
};

constexpr HostType kTypes[] = {
#define FTW_GGML_ENTRY(T) {#T, T::size.id, T::size.block_values},
    FTW_GGML_CUDA_TYPES(FTW_GGML_ENTRY)
#undef FTW_GGML_ENTRY
};

const HostType* find_type(int id) {
    for (const HostType& t : kTypes)
        if (t.id == id) return &t;
    return nullptr;
}

std::string type_list() {
    std::string s;
    for (const HostType& t : kTypes) s += (s.empty() ? "" : ", ") + std::string(t.name);
    return s;
}

// banks: gate_up (gate rows then up rows, raw bytes), down [H, row bytes], optional f32 biases
int needs(int H, int I, const KernelParams& kp, BankNeed* out) {
    static const char* proj[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i) {
        const HostType* t = find_type(kp.ggml_type[i]);
        if (t == nullptr)
            throw UnsupportedError("gguf " + std::string(proj[i]) + " rows: ggml type id " +
                                   std::to_string(kp.ggml_type[i]) + " has no CUDA decoder (CUDA types: " +
                                   type_list() + ")");
        const int n = i < 2 ? H : I;
        if (n % t->block_values)
            throw FormatError("gguf " + std::string(proj[i]) + " rows: " + t->name + " rows hold whole blocks of " +
                              std::to_string(t->block_values) + " values; " + std::to_string(n) + " is not a multiple");
    }
    const int64_t gu = int64_t(I) * (row_bytes_of(kp.ggml_type[0], H) + row_bytes_of(kp.ggml_type[1], H));
    out[0] = {0, "gate_up", gu, 1, false};  // ld32 reads any byte address
    out[1] = {1, "down", int64_t(H) * row_bytes_of(kp.ggml_type[2], I), 1, false};
    out[2] = {2, "gate_up_bias", int64_t(2) * I * 4, 4, true};
    out[3] = {3, "down_bias", int64_t(H) * 4, 4, true};
    return 4;
}

}  // namespace

std::vector<std::string> ggml_cuda_types() {
    std::vector<std::string> names;
    for (const HostType& t : kTypes) names.emplace_back(t.name);
    return names;
}

// registered by hand rather than with FTW_CUDA_FORMAT: the launch picks a decoder per projection
static const CudaFormat kGguf = {"gguf", GgmlDecoder::VEC, needs, launch, 2, 3, false};
static const CudaFormatRegistrar kGgufRegistrar(&kGguf);

}  // namespace ftw::cuda
