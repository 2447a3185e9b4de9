// GGUF experts on the GPU: raw ggml rows, a ggml type per projection (gate, up, down), read from
// the slots as the file stores them. A 32-value unit of a row is one sub-block of its ggml block
// (a whole block for the 32-value types, one eighth of a 256-value K/IQ super-block).
//
// Two kinds of decoder, from the one type list below (FTW_GGML_CUDA_TYPES):
// - TypedDecoder<T> (a Fast<T> specialisation per type): a projection whose rows are all of type T
//   (gate and up both, or down) and whose bank sits on 16-byte boundaries runs a kernel made for
//   T, which decodes without int -> float conversions from the unit's bytes, had in one of three
//   ways: copied with the row's chunk into shared memory by cp.async (decode's staged kernel,
//   StagedRows), or a ring stage ahead in registers, or in the L1 for the types whose bytes would
//   not fit (the register-fed kernels: Fast<T>::kPrefetch). 14 types; Q5_0, Q4_1, Q5_1 have none.
// - GgmlDecoder, table-driven: the type is a value of the row, so one kernel instantiation covers
//   every type (gate != up, unaligned banks, the three types above); each unit is read at decode.
// The launch (launch.cu) looks each projection's decoder up by its ggml type; FTW_GGUF_CUDA_DECODER=
// table | staged | loaded | prefetched forces one kind (tests, the bench's comparisons), as
// FTW_GGUF_CUDA_MIN does the way the types with mins apply them (with_min_form) and
// FTW_GGUF_CUDA_SHARED the way the staged kernel reads its ring (generic_shared_loads) and
// FTW_GGUF_CUDA_INTSUMS whether the IQ types decode on float32 sums (int_sums); a
// type's default register-fed decode runs experts_decode's shaped loop (ShapedDecoder,
// FTW_CUDA_REGISTER_SHAPE=legacy the legacy one).
//
// Build: this header holds the decoders; each type's kernels are compiled in one of kSlices
// translation units that build.cmake generates (slice.cuh), which register the type's launcher
// with the launch, so the types compile in parallel (one unit held them all: 158 s of a 175 s
// build on 16 cores).
//
// Numerics. The table-driven decoder computes a unit's 32 floats exactly as ggml's
// dequantize_row_* does (bit-exact float32: products rounded in ggml's order, no FMA
// contraction), then rounds them to bf16 for the tensor cores. The typed decoders compute in bf16
// from the start (int_pairs: a small integer is exact in bf16, the sub-block's scale is applied by
// one bf16x2 multiply or fma): the value is the integer times the scale rounded to bf16, rounded
// once, so it is within about 2^-8 of ggml's float32 value (relative) rather than 2^-9, and the
// scale's rounding is shared by the sub-block's values. The types with mins (Q4_K, Q5_K, Q2_K)
// must not round the min on its own: it is as large as the values, and its rounding would be
// common to the sub-block (scale and min rounded once each, "ScaledOffset", put `ftw check
// --runtime cuda` at 1.4-1.6e-2 on the Q4_K samples against its 2e-2 bound). Q4_K and Q2_K take
// the min's integer multiple c0 = round(m1 / d1) of the scale off the quant exactly and round only
// the rest (ShiftedMin: value = (q - c0) * d1 + (c0 * d1 - m1), d1 rounded to bf16; 3
// instructions per pair as ScaledOffset): `ftw check` 5.6-6.1e-3 on the qwen3moe Q4_K sample
// (7.5-9.0e-3 with ScaledMin). Q5_K carries scale and min as bf16 pairs hi + lo (ScaledMin,
// within an ulp of ggml's float32 value rounded to bf16, 2 more instructions per pair): with
// ShiftedMin's rounded scale the test case Q5_K T=1, at 6.2e-3 with values rounded once, would
// measure 8.7e-3 against the tests' 8e-3 (numpy emulation). Q2_K's staged decode (its default,
// Fast<Q2_K>::decode_tables) takes none of these forms: a 16-value half has only four values,
// ggml's float32 d*sc * q - dmin*m for q = 0..3, each rounded once to bf16 (the table-driven
// decoder's values) and looked up by prmt. docs/BENCHMARKS.md has the figures.
// Decode (T <= 8) of Q2_K, Q3_K, Q4_K, Q5_K and Q6_K rows rounds no weight at all: the staged
// kernel puts their quants in the mma as exact integers and applies each sub-block's scale and min
// (ggml's float32 products) to the float32 sums (SubBlockRows, kSubBlocks below); ShiftedMin /
// ScaledMin, Q2_K's values table and the bf16 decoders serve their register-fed and prefill
// kernels and FTW_GGUF_CUDA_SUBBLOCKS=0 (=32: Q2_K, Q3_K, Q6_K only).
// Decode of IQ2_XXS, IQ2_XS and IQ3_S rows rounds no weight either: their grid values enter the mma
// as exact signed bf16 integers, the scales go onto the float32 sums (IntSumRows, IqInt below).
// Decode of Q8_0 rows of whole 256-value chunks rounds no weight either: each int8 enters the mma
// as two exact integers (its nibbles under two bf16 magics), each block's d goes onto the float32
// sums (Fast<Q8_0>'s sub-block interface). Otherwise Q8_0 takes its integer through an exact
// float32 (8 bits do not fit a bf16 magic), rounding q d to bf16; MXFP4's values
// are exact in bf16, as in the mxfp4 format. Either way the error of a dot product averages out to
// a few 1e-3 relative (tests/test_cuda_kernels_gguf.py states the tolerance).
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "cuda/experts.h"
#include "cuda/experts_kernels.cuh"
#include "cuda/scaled_units.cuh"  // e2m1x8_raw_mul, e2m1_unit_raw

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

// ---- decoders of their own: a unit's bytes loaded a ring stage ahead ---------------------------
//
// A type with a decoder of its own (a Fast<T> specialisation) runs a projection whose rows are all
// of that type (gate and up both, or down) through TypedDecoder<T>: load() only issues the loads
// of the unit's weight bytes and of the scale bytes it needs, into registers (Raw), so the
// kernels' ring keeps them in flight; decode() works from those registers. Values are made in
// bf16 without int -> float conversions (a quarter-rate instruction): see int_pairs below, and the
// numerics in the file header.
// Blocks are only as aligned as their size allows (Q8_0: 34 bytes, 2-byte aligned; MXFP4: 17),
// so a unit's bytes are read as the aligned 8-byte words covering them (Span) and shifted into
// place in registers (bytes_at). The launch takes these decoders only where the bank base and the
// slot stride are 16-byte aligned (as the pools make them): a block then sits at a multiple of
// gcd(16, block bytes), the alignment each decoder assumes.

__device__ __forceinline__ uint2 ld_stream2(const void* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t addr_low(const uint8_t* p, uint32_t mask) {
    return uint32_t(reinterpret_cast<uintptr_t>(p)) & mask;
}

// p rounded down to a multiple of A bytes, through an integer
template <int A, class P>
__device__ __forceinline__ const P* align_int(const uint8_t* p) {
    return reinterpret_cast<const P*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(A - 1));
}

// Where a decoder's load<M>() reads a unit's bytes: global memory (the register-fed kernels, a
// ring stage ahead: weight bytes streamed past the L1, block heads through it, as the quad's four
// lanes share them), or the staged kernel's shared-memory ring (plain loads of an address there;
// the kernel orders them after the copies landed).
struct GlobalLoads {
    static constexpr bool kShared = false, kRealign = false;
    __device__ static uint4 stream16(const void* p) { return ld_stream(p); }
    __device__ static uint4 cached16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
    __device__ static uint2 stream8(const void* p) { return ld_stream2(p); }
    __device__ static uint32_t word(const void* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
    template <int A, class P = uint8_t>
    __device__ static const P* align(const uint8_t* p) { return align_int<A, P>(p); }
};
// The shared-memory ring's addresses are rounded down by pointer arithmetic rather than through
// an integer, so that the compiler still sees them as pointers into shared memory: ld.shared with
// 32-bit addresses, where through an integer they became generic loads with 64-bit address
// arithmetic (SharedLoadsGeneric, which also reads spans as 8-byte words). H200, T=1: Q6_K 0.26x
// -> 0.30x of the ceiling, Q3_K 0.17x -> 0.20x; IQ3_S 0.20x -> 0.19x, so the IQ types keep
// SharedLoadsGeneric (Fast<T>::kGenericShared); FTW_GGUF_CUDA_SHARED=generic | shared forces one
// for every type (docs/BENCHMARKS.md, "GGUF mins and shared loads").
struct SharedLoads {
    static constexpr bool kShared = true, kRealign = true;  // kRealign: load_span's words shifted into place
    __device__ static uint4 stream16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
    __device__ static uint4 cached16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
    __device__ static uint2 stream8(const void* p) { return *reinterpret_cast<const uint2*>(p); }
    __device__ static uint32_t word(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }
    template <int A, class P = uint8_t>
    __device__ static const P* align(const uint8_t* p) { return reinterpret_cast<const P*>(p - addr_low(p, A - 1)); }
};
struct SharedLoadsGeneric : SharedLoads {
    static constexpr bool kRealign = false;
    template <int A, class P = uint8_t>
    __device__ static const P* align(const uint8_t* p) { return align_int<A, P>(p); }
};

// the aligned 8-byte words covering L bytes at an address aligned to A (the last word may hold
// bytes past the L, never past the aligned word holding the block's last byte)
template <int L, int A>
struct Span {
    static constexpr int N = (L + 8 - A + 7) / 8;
    uint2 v[N];
};

template <int L, int A, class M = GlobalLoads>
__device__ __forceinline__ Span<L, A> load_span(const uint8_t* a) {
    if constexpr (M::kRealign) {
        // Shared memory reads 4-byte words at any word address: the L bytes shifted into place
        // here (a funnel shift per word, by a % 4), so the decoder's byte selection (bytes_at)
        // sees offset 0 (span_offset) and folds away. Only words holding the L bytes are read.
        constexpr int NB = (L + 3) / 4;
        const uint32_t off = addr_low(a, 3), last = (off + L - 1) >> 2;
        const uint32_t* w = M::template align<4, uint32_t>(a);
        uint32_t x[NB + 1], y[2 * Span<L, A>::N];
#pragma unroll
        for (int i = 0; i <= NB; ++i) x[i] = M::word(w + min(uint32_t(i), last));
#pragma unroll
        for (int i = 0; i < 2 * Span<L, A>::N; ++i) y[i] = i < NB ? __funnelshift_r(x[i], x[i + 1], off * 8) : 0u;
        Span<L, A> s;
#pragma unroll
        for (int i = 0; i < Span<L, A>::N; ++i) s.v[i] = make_uint2(y[2 * i], y[2 * i + 1]);
        return s;
    }
    const uint2* base = M::template align<8, uint2>(a);
    // N words cover L bytes at the worst offset; at a better one the last would lie past them
    // (past the bank, for its last block): read the last word holding one of them again instead
    const uint32_t last = (addr_low(a, 7) + L - 1) >> 3;
    Span<L, A> s;
#pragma unroll
    for (int i = 0; i < Span<L, A>::N; ++i) s.v[i] = M::stream8(base + min(uint32_t(i), last));
    return s;
}

// the offset of a span's first byte in its words: a % 8, or 0 where load_span shifted them
template <class M>
__device__ __forceinline__ uint32_t span_offset(const uint8_t* a) {
    return M::kRealign ? 0u : addr_low(a, 7);
}

// the 4-byte word holding the (2-byte aligned) bytes at a, and their byte position in it
template <class M = GlobalLoads>
__device__ __forceinline__ uint32_t ld_word_at(const uint8_t* a) {
    return M::word(M::template align<4>(a));
}

template <int L, int A>
__device__ __forceinline__ void span_words(const Span<L, A>& s, uint32_t (&w)[2 * Span<L, A>::N]) {
#pragma unroll
    for (int i = 0; i < Span<L, A>::N; ++i) w[2 * i] = s.v[i].x, w[2 * i + 1] = s.v[i].y;
}


// out[k] = the 4 bytes at byte r + 4k of the little-endian words w, for r <= MAXR (words past w's
// end read as 0: only bytes beyond the ones asked for come from them). FUNNEL: r may be odd or 2
// mod 4 (else a multiple of 4).
template <int NO, int MAXR, bool FUNNEL, int NI>
__device__ __forceinline__ void bytes_at(const uint32_t (&w)[NI], uint32_t r, uint32_t (&out)[NO]) {
    constexpr int NB = NO + (FUNNEL ? 1 : 0);
    uint32_t b[NB + 1], a[NB];
#pragma unroll
    for (int k = 0; k <= NB; ++k) {
        const uint32_t w0 = k < NI ? w[k] : 0u, w2 = k + 2 < NI ? w[k + 2] : 0u;
        b[k] = (MAXR >= 8 && (r & 8)) ? w2 : w0;
    }
#pragma unroll
    for (int k = 0; k < NB; ++k) a[k] = (MAXR >= 4 && (r & 4)) ? b[k + 1] : b[k];
#pragma unroll
    for (int k = 0; k < NO; ++k) out[k] = FUNNEL ? __funnelshift_r(a[k], a[k + 1], (r & 3) * 8) : a[k];
}

__device__ __forceinline__ float half_bits(uint32_t h) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFFu)));
}

constexpr float kTwo23 = 8388608.0f;

// 2^23 + byte k of x, exactly
__device__ __forceinline__ float magic_byte(uint32_t x, int k) {
    return __uint_as_float(prmt(x, 0x4B000000u, 0x7540u | uint32_t(k)));
}

// ---- bf16 arithmetic on pairs: the typed decoders' values (numerics: see the file header) ------
//
// A small integer becomes a bf16 exactly without conversions: a byte b < 128 under the exponent
// of bf16 128 (bits 0x4300) is 128 + b. Subtracting 128 + bias is exact (a small integer), and
// one bf16x2 fma applies the sub-block's scale and offset with one rounding: per pair of values a
// prmt, a sub and an fma, all but the prmt on the FMA pipe, instead of ~3 float32 instructions
// and an int pipe prmt per value.

__device__ __forceinline__ uint32_t bfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t bsub2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// the bf16 pair (v, v) of v = +-2^k (exact constants for the magic-number arithmetic below)
__host__ __device__ constexpr uint32_t bf16x2_pow2(int k, bool negative = false) {
    return ((negative ? 0x8000u : 0u) | uint32_t(127 + k) << 7) * 0x10001u;
}
__device__ __forceinline__ uint32_t badd2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// s rounded to bf16, in both halves
__device__ __forceinline__ uint32_t bf16x2_of(float s) { return pack_bf16x2(s, s); }

// bf16x2 of (128 + bias, 128 + bias): what bsub2 takes off the biased pairs below
__host__ __device__ constexpr uint32_t bf16x2_biased(int bias) {
    return ((0x4300u + uint32_t(bias)) << 16) | (0x4300u + uint32_t(bias));
}

// The bytes b0..b3 of x (each < 128) as the values f(b - bias), in the pairs w[0] = (v0, v1),
// w[1] = (v2, v3); B = bf16x2_biased(bias); b - bias is exact, f scales it (Scaled,
// ScaledMin).
template <class F>
__device__ __forceinline__ void int_pairs(uint32_t x, uint32_t B, const F& f, uint32_t* w) {
    w[0] = f(bsub2(prmt(x, 0x43u, 0x4140u), B));  // bytes (b0, 0x43, b1, 0x43)
    w[1] = f(bsub2(prmt(x, 0x43u, 0x4342u), B));
}

// q * d: d rounded to bf16 once per sub-block, the product rounded once
struct Scaled {
    uint32_t d;
    __device__ explicit Scaled(float s) : d(bf16x2_of(s)) {}
    __device__ uint32_t operator()(uint32_t q) const { return hmul2(q, d); }
};

// q * d1 - m1 (the K-quants with mins) with d1 and m1 each carried as a bf16 pair hi + lo (16
// bits, about float32's product of an f16 and a 6-bit scale), the small terms first: the value is
// rounded once at its own size, within an ulp of ggml's float32 value rounded to bf16. With d1 and
// m1 rounded to bf16 once (one fma per pair, "ScaledOffset"; measured on the H200, then dropped)
// the two roundings put one error on all 32 values of a sub-block: a Q5_K test case measured
// 8.5e-3 against the 8e-3 bound, the Q4_K samples' `ftw check` 1.4-1.6e-2 against 2e-2. These two
// more bf16 instructions per pair, on the FMA pipe, cost Q5_K 30% and Q4_K 45% (docs/BENCHMARKS.md);
// Q4_K and Q2_K take ShiftedMin below instead, Q5_K keeps this form (file header).
struct ScaledMin {
    static constexpr uint32_t b = bf16x2_biased(0);  // the bias int_pairs takes off: q itself
    uint32_t dh, dl, ch, cl;
    __device__ ScaledMin(float d1, float m1) {
        const float h = __bfloat162float(__float2bfloat16_rn(d1)), c = __bfloat162float(__float2bfloat16_rn(-m1));
        dh = bf16x2_of(h), dl = bf16x2_of(d1 - h), ch = bf16x2_of(c), cl = bf16x2_of(-m1 - c);
    }
    __device__ uint32_t operator()(uint32_t q) const { return bfma2(q, dh, badd2(bfma2(q, dl, cl), ch)); }
};

__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// q * d1 - m1 as u * d1 + r (ShiftedMin): u = q - c0 with the integer c0 = m1 / d1 rounded (0..127),
// taken off exactly by int_pairs' subtraction (its bias b), and r = c0 * d1 - m1 (one float32
// fma, rounded to bf16: |r| <= d1 / 2 where m1 is up to 63 d1); value = u * d1 + r with d1 rounded
// to bf16, one fma per pair as for ScaledOffset (scale and min rounded once each). The min's
// large part, c0 * d1, is exact, so no error of the size of m1 is left common to the sub-block's
// values; u is the value in units of d1 (centred where the sub-block is), so rounding d1 scales
// the values as the symmetric types' rounded scales do.
struct ShiftedMin {
    uint32_t b, d, r;
    __device__ ShiftedMin(float d1, float m1) {
        // m1 / d1 clamped to 0..127 and rounded to an integer by adding 2^23, whose bits are then
        // 0x4B000000 + c0; d1 = 0 gives 127 (0 with m1 = 0), and any c0 gives u * 0 + r = -m1 then
        const float t = __fadd_rn(fminf(fmaxf(m1 * rcp_approx(d1), 0.f), 127.f), kTwo23);
        b = __float_as_uint(t) * 0x10001u + (bf16x2_biased(0) - 0x4B000000u);  // bf16x2_biased(c0)
        d = bf16x2_of(d1);
        r = bf16x2_of(fmaf(__fsub_rn(t, kTwo23), d1, -m1));
    }
    __device__ uint32_t operator()(uint32_t u) const { return bfma2(u, d, r); }
};

// How the types with mins (Q4_K, Q5_K, Q2_K) apply scale and min: each type's Fast<T>::kMinForm,
// or the other form where FTW_GGUF_CUDA_MIN=hilo | shift names it (the bench's and the tests'
// comparisons; rows of type T then run as WithMin<T, form>).
enum MinForm { kMinHiLo, kMinShift };
template <int F>
using MinOf = std::conditional_t<F == kMinHiLo, ScaledMin, ShiftedMin>;
template <class T, int F>
struct WithMin : T {};

// four IQ4 nibbles (bits 0..15 of s, low first) -> a byte each of the level table held in the
// four generated words t0..t3 (bit 3 of a nibble picks the upper eight entries)
__device__ __forceinline__ uint32_t iq4_lookup(uint32_t s, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t i = s & 0x7777u;
    return prmt(prmt(t0, t1, i), prmt(t2, t3, i), ((s >> 1) & 0x4444u) | 0x3210u);
}

// 16 bytes of IQ4 nibbles (value j: low nibble of byte j, value j + 16: its high nibble) times dl:
// the levels' bf16 bit patterns looked up a byte at a time (exact: small integers), times dl in
// bf16 (one rounding)
__device__ __forceinline__ void iq4_values(const uint32_t (&q)[4], float dl, uint32_t (&w)[16]) {
    const Scaled f(dl);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // bytes l = 4k + 2half, l + 1: v_l, v_l+16, v_l+1, v_l+17
            const uint32_t s = q[k] >> (16 * half);
            const uint32_t lo = iq4_lookup(s, tb::iq4nl_bf16_lo_word0, tb::iq4nl_bf16_lo_word1,
                                           tb::iq4nl_bf16_lo_word2, tb::iq4nl_bf16_lo_word3);
            const uint32_t hi = iq4_lookup(s, tb::iq4nl_bf16_hi_word0, tb::iq4nl_bf16_hi_word1,
                                           tb::iq4nl_bf16_hi_word2, tb::iq4nl_bf16_hi_word3);
            w[2 * k + half] = f(prmt(lo, hi, 0x6240u));      // (v_l, v_l+1)
            w[8 + 2 * k + half] = f(prmt(lo, hi, 0x7351u));  // (v_l+16, v_l+17)
        }
    }
}

// iq4_values' pairs times 2^-62 (kValueV1), in fewer instructions: one byte plane looked up
// instead of two, so no interleave of planes and four table words instead of eight. The plane is
// u = level + 128 (1..241: iq4nl_biased_word*), and a byte u under a zero byte is the bf16 bit
// pattern of u * 2^-133 exactly (a subnormal up to 127, exponent field 1 from 128 on: one step of
// 2^-133 throughout). One bf16x2 fma per pair, u * 2^-133 * (dl * 2^71) - 128 dl * 2^-62, gives
// level * dl * 2^-62 rounded once: both factors exact scalings of bf16(dl) for any f16-sized dl (no
// overflow, no subnormal), so the bits are iq4_values' times 2^-62 (the decoder's kPost = 2^62
// scales the float32 sums back). The nibble masks are made once per word of 8 values: 19
// instructions per 8 values where iq4_values takes 27, and two table words in registers instead
// of four (docs/BENCHMARKS.md, "IQ4 levels in one biased plane").
__device__ __forceinline__ void iq4_values_biased(const uint32_t (&q)[4], float dl, uint32_t (&w)[16]) {
    const uint32_t d = bf16x2_of(dl * 0x1p71f), c = bf16x2_of(dl * -0x1p-55f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        // per nibble: bits 0..2 index a word pair, bit 3 picks the pair (iq4_lookup's two steps)
        const uint32_t i = q[k] & 0x77777777u, sel = ((q[k] >> 1) & 0x44444444u) | 0x32103210u;
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // bytes l = 4k + 2half, l + 1: u_l, u_l+16, u_l+1, u_l+17
            const uint32_t ih = i >> (16 * half), sh = sel >> (16 * half);
            const uint32_t u = prmt(prmt(tb::iq4nl_biased_word0, tb::iq4nl_biased_word1, ih),
                                    prmt(tb::iq4nl_biased_word2, tb::iq4nl_biased_word3, ih), sh);
            w[2 * k + half] = bfma2(prmt(u, 0u, 0x4240u), d, c);      // (v_l, v_l+1)
            w[8 + 2 * k + half] = bfma2(prmt(u, 0u, 0x4341u), d, c);  // (v_l+16, v_l+17)
        }
    }
}

// How IQ4_NL, IQ4_XS and MXFP4 make their values (ValueForm): kValueV1, the default (IQ4: one
// biased plane and an fma per pair, iq4_values_biased; MXFP4: e2m1 pairs by one multiply each,
// e2m1x8_raw_mul, and the scale pair by e8m0_bf16x2), or kValueV0, the decode before (IQ4: two
// planes times dl, iq4_values; MXFP4: e2m1x8_raw's shifts, e8m0_bf16 and a shift), which
// FTW_GGUF_CUDA_VALUES=0 selects (with_form; rows of type T then run as WithValues<T, 0>). Both
// forms of a type give the same bf16 weights (IQ4 V1: times 2^-62, which kPost takes off the sums).
enum ValueForm { kValueV0, kValueV1 };
template <class T, int F>
struct WithValues : T {};
template <int F>
struct Iq4Values {
    static constexpr int kValueForm = F;
    __device__ static void values(const uint32_t (&q)[4], float dl, uint32_t (&w)[16]) { iq4_values(q, dl, w); }
};
template <>
struct Iq4Values<kValueV1> {
    static constexpr int kValueForm = kValueV1;
    static constexpr float kPost = kTwo62;
    __device__ static void values(const uint32_t (&q)[4], float dl, uint32_t (&w)[16]) {
        iq4_values_biased(q, dl, w);
    }
};

// The staged kernel's int8 unit (kOptInt8, T = 1: experts_decode_staged's IMMA m16n8k32 u8 x s8):
// a 16-entry table of levels, each half (codes with bit 3 clear, lo; set, hi) of one sign, looked
// up as level + 128 (u8; the kernel takes 128 times the x group's sum off the integer sums). Per
// 16-bit half of a word of 4 nibble codes, two prmt and an IADD3: the lo half's magnitudes by the
// codes as they are (a code with bit 3 set selects in prmt's sign mode: the sign of a byte below
// 128, 0), the hi half's by the codes with bit 3 flipped (the lo codes then give 0), so one of the
// two is 0 and 128 + pos - neg has no carry between bytes. Byte i of the result is the code of
// nibble i: for the word of unit bytes 4 s .. 4 s + 3 (values 4 s + r low, 16 + 4 s + r high
// nibbles), a0 holds values 4 s, 16 + 4 s, 4 s + 1, 17 + 4 s and a2 4 s + 2, 18 + 4 s, 4 s + 3,
// 19 + 4 s: the x order kInt8Interleaved names (the kernel's quantize_int8 stores x so).
// Tables generated from the gguf package (gen_tables.py: *_i8_{lo,hi}_word*, *_i8_lo_negative).
// With tables whose every byte has bit 7 set (iq4nl_s8_*: the other half's codes then select 0xFF)
// the same lookups give the levels as s8 (Iq4Int8Tokens, the int8 units of several tokens).
template <uint32_t L0, uint32_t L1, uint32_t H0, uint32_t H1, bool LoNegative>
__device__ __forceinline__ void nibbles_u8(uint32_t w, uint32_t& a0, uint32_t& a2) {
    const uint32_t wx = w ^ 0x88888888u;
    auto half = [](uint32_t c, uint32_t cx) {
        const uint32_t lo = prmt(L0, L1, c), hi = prmt(H0, H1, cx);
        return LoNegative ? hi + 0x80808080u - lo : lo + 0x80808080u - hi;
    };
    a0 = half(w, wx);
    a2 = half(w >> 16, wx >> 16);
}
// the four words of a unit's 16 nibble bytes into the 8 A words of its 4 IMMA (a[2 s], a[2 s + 1])
__device__ __forceinline__ void iq4nl_u8(const uint32_t (&q)[4], uint32_t (&a)[8]) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
        nibbles_u8<tb::iq4nl_i8_lo_word0, tb::iq4nl_i8_lo_word1, tb::iq4nl_i8_hi_word0, tb::iq4nl_i8_hi_word1,
                   tb::iq4nl_i8_lo_negative>(q[s], a[2 * s], a[2 * s + 1]);
}

// The 6-bit (scale, min) of sub-block j of Q4_K / Q5_K from the block's first 16 bytes
// (d, dmin, scales[12]), as k4_scale_min: bytes j % 4 of the three scale words shifted down once,
// both forms computed and one selected (12 instructions where selecting a word per byte read took
// about twice that: cuobjdump of the two forms alone, 48 against 80 in a one-line kernel)
__device__ __forceinline__ void k4_head_scale_min(const uint4& h, int j, uint32_t& sc, uint32_t& mn) {
    const uint32_t s = 8 * (j & 3);
    const uint32_t y = h.y >> s, z = h.z >> s, w = h.w >> s;  // scales[j % 4], [4 + j % 4], [8 + j % 4]
    const bool lo = j < 4;
    sc = lo ? y & 63 : (w & 15) | ((y >> 2) & 0x30);
    mn = lo ? z & 63 : ((w >> 4) & 15) | ((z >> 2) & 0x30);
}

// 32 values f(q) = d1 * q - m1 from eight words of bytes q (< 128, byte l of the unit at byte
// l % 4 of word l / 4)
template <class F>
__device__ __forceinline__ void k_values(const uint32_t (&q)[8], const F& f, uint32_t (&w)[16]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) int_pairs(q[k], f.b, f, w + 2 * k);
}

// A unit that is one whole block of N bytes (32 values), aligned to A: the block's bytes and the
// offset of its first byte within the loaded words.
template <int N, int A>
struct WholeBlock {
    struct Raw {
        Span<N, A> s;
        uint32_t o;
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u) * N;
        if constexpr (M::kShared) {
            // Shared memory reads 4-byte words at any word address: shift the block's bytes into
            // place here, so that decode sees offset 0 and its byte selection folds away (fewer
            // registers: decode's select network spilled in the staged kernel). Only the words
            // holding the block's bytes are read.
            constexpr int NW = 2 * Span<N, A>::N, NB = (N + 3) / 4;
            const uint32_t* w = M::template align<4, uint32_t>(b);
            const uint32_t off = addr_low(b, 3), last = (off + N - 1) >> 2;
            uint32_t x[NB + 1], y[NW];
#pragma unroll
            for (int i = 0; i <= NB; ++i) x[i] = M::word(w + min(uint32_t(i), last));
#pragma unroll
            for (int i = 0; i < NW; ++i) y[i] = i < NB ? __funnelshift_r(x[i], x[i + 1], off * 8) : 0u;
            Raw r;
#pragma unroll
            for (int i = 0; i < Span<N, A>::N; ++i) r.s.v[i] = make_uint2(y[2 * i], y[2 * i + 1]);
            r.o = 0;
            return r;
        } else {
            return {load_span<N, A, M>(b), addr_low(b, 7)};
        }
    }
};

// Fast<T>: T's own decoder (kHas), or none (the table-driven GgmlDecoder serves T).
template <class T>
struct Fast {
    static constexpr bool kHas = false;
};
// rows of a type with mins, scale and min applied the form F way (Fast<T>::WithForm<F>)
template <class T, int F>
struct Fast<WithMin<T, F>> : Fast<T>::template WithForm<F> {
    static_assert(Fast<T>::template WithForm<F>::kHas, "a form of a type with a decoder of its own");
};

// d:f16 | qs:int8[32]; 34-byte blocks, 2-byte aligned
template <>
struct Fast<Q8_0> : WholeBlock<34, 2> {
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.33x of the ceiling; loaded 0.32x, staged 0.31x
    // H200, T=1: 0.44x with the staged kernel's kOptCopy32 | kOptFull (0.40x without), 0.63x with
    // its ring of 2 stages (launch_decode; qwen3-30b-a3b size 0.37x), the shaped register-fed loop
    // 0.34x; on float32 block sums (below) 0.646x with the one-column body at that size (0.635x in
    // the same run without sums), qwen3-30b-a3b 0.39x (0.37x; T=8 same 0.34x against 0.31x)
    static constexpr bool kStaged = true;
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t v[10], dq[1], q[8];
        span_words(raw.s, v);
        bytes_at<1, 6, true>(v, raw.o, dq);
        bytes_at<8, 8, true>(v, raw.o + 2, q);
        // an int8 takes 8 bits, one more than a magic bf16 holds: q as an exact float32 (2^23 + q + 128,
        // minus 2^23 + 128), whose high half is q in bf16 (exact: |q| <= 128), times d
        const Scaled f(half_bits(dq[0]));
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t x = q[k] ^ 0x80808080u;  // q + 128
            float qf[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) qf[b] = __fsub_rn(magic_byte(x, b), kTwo23 + 128.0f);
            w[2 * k] = f(prmt(__float_as_uint(qf[0]), __float_as_uint(qf[1]), 0x7632u));
            w[2 * k + 1] = f(prmt(__float_as_uint(qf[2]), __float_as_uint(qf[3]), 0x7632u));
        }
    }
    // The staged kernel's sub-block interface (SubBlockRows; kSplitValues: see
    // staged_sub_block_chunk) for rows of whole 256-value chunks, each block a 32-value sub-block
    // with its own d. An int8 does not fit one bf16 magic, so each quant enters the mma as two
    // exact integers: with u = q + 128 (the byte ^ 0x80), 128 + (u & 15) (one prmt per pair under
    // the exponent of bf16 128) and 2048 + 16 (u >> 4) (under that of 2048: bf16 0x45 is 2048 plus
    // 16 per mantissa step), whose sum is q + 2304; P = sum (q + 2304) x, so s = d and n = -2304 d,
    // no weight rounded (the bf16 decode above rounds q d to bf16). Per 4 values a mask, a shift
    // and a lop3, and 4 prmt, where decode takes a xor, 4 prmt, 4 float subs, 2 prmt and 2 bf16
    // multiplies. Rows of whole chunks on a 16-byte-aligned bank start every chunk on 16 bytes in
    // the ring (272 bytes a chunk), so block j's d (byte 34 j) and the lane's 8 quants (bytes
    // 34 j + 2 + 8 tig ..) lie at offsets known per j: aligned 4-byte words, realigned by one prmt
    // each for the even blocks (2 mod 4). The launch takes it only for rows of whole chunks
    // (sub_block_rows).
    static constexpr bool kSubBlocks = true, kSplitValues = true;
    static constexpr int kSumOffset = 2304;  // n = -2304 s (the kernel: s * (P - 2304 X))
    struct Head {
        const uint32_t* w;  // the chunk's words (its first byte on 16 bytes)
    };
    __device__ static Head head(const uint8_t* b) { return {reinterpret_cast<const uint32_t*>(b)}; }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) {
        const int o = 34 * j;  // d's bytes: o % 4 is 0 (j even) or 2
        s = half_bits(h.w[o >> 2] >> (8 * (o & 3)));
        n = -2304.f * s;
    }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][8]) {
        const uint32_t* a = reinterpret_cast<const uint32_t*>(b) + 2 * tig;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int o = 34 * (2 * c2 + e) + 2;  // block 2 c2 + e's quants (this lane's from o + 8 tig)
            uint32_t q[2];
            if (o % 4 == 0) {
                q[0] = a[o >> 2], q[1] = a[(o >> 2) + 1];
            } else {
                const uint32_t w0 = a[o >> 2], w1 = a[(o >> 2) + 1], w2 = a[(o >> 2) + 2];
                q[0] = prmt(w0, w1, 0x5432u), q[1] = prmt(w1, w2, 0x5432u);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t lo = q[i] & 0x0F0F0F0Fu, hi = ((q[i] >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u;
                w[e][2 * i] = prmt(lo, 0x43u, 0x4140u), w[e][2 * i + 1] = prmt(lo, 0x43u, 0x4342u);
                w[e][4 + 2 * i] = prmt(hi, 0x45u, 0x4140u), w[e][5 + 2 * i] = prmt(hi, 0x45u, 0x4342u);
            }
        }
    }
    // the lane-blocks interface (kOptLaneBlocks: staged_sub_block_lanes): lane tig's blocks 2 tig
    // (d at byte 68 tig, quants from 68 tig + 2: realigned by a prmt per word) and 2 tig + 1 (d at
    // 68 tig + 34, quants from 68 tig + 36: aligned); values 8 p .. 8 p + 7 split as decode_pair's
    // (off by default, kLaneBlocksDefault: measured level with the one-column body, H200, deepseek-v3
    // size, T = 1: 132.6 against 132.7 us, 0.65x the ceiling; FTW_CUDA_STAGED_LANES=1 runs it)
    static constexpr bool kLaneBlocks = true, kLaneBlocksDefault = false;
    struct LaneHead {
        uint32_t d;  // the f16 d of block 2 tig (low half) and of 2 tig + 1 (high half)
    };
    __device__ static LaneHead lane_head(const uint8_t* b, int tig) {
        const uint32_t* a = reinterpret_cast<const uint32_t*>(b) + 17 * tig;
        return {prmt(a[0], a[8], 0x7610u)};
    }
    __device__ static void lane_scale(const LaneHead& h, int e, float& s, float& n) {
        s = half_bits(e ? h.d >> 16 : h.d);
        n = -2304.f * s;
    }
    __device__ static void decode_lane(const uint8_t* b, int tig, int p, uint32_t (&w)[2][8]) {
        const uint32_t* a = reinterpret_cast<const uint32_t*>(b) + 17 * tig + 2 * p;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            uint32_t q[2];
            if (e == 0) {  // bytes 68 tig + 2 + 8 p ..: words 0..2 from a, realigned
                const uint32_t w0 = a[0], w1 = a[1], w2 = a[2];
                q[0] = prmt(w0, w1, 0x5432u), q[1] = prmt(w1, w2, 0x5432u);
            } else {  // bytes 68 tig + 36 + 8 p ..: words 9, 10
                q[0] = a[9], q[1] = a[10];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t lo = q[i] & 0x0F0F0F0Fu, hi = ((q[i] >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u;
                w[e][2 * i] = prmt(lo, 0x43u, 0x4140u), w[e][2 * i + 1] = prmt(lo, 0x43u, 0x4342u);
                w[e][4 + 2 * i] = prmt(hi, 0x45u, 0x4140u), w[e][5 + 2 * i] = prmt(hi, 0x45u, 0x4342u);
            }
        }
    }
};

// the 18-byte blocks d:f16 | qs[16] (Q4_0, IQ4_NL), 2-byte aligned: d and the 16 nibble bytes
struct Block18 : WholeBlock<18, 2> {
    // kOptInt8Tokens (T = 2..8): a row's chunk of 8 blocks (144 bytes from a 16-byte boundary of the
    // ring) read as 9 16-byte LDS; block u's d at byte 18 u, its qs from 18 u + 2. An odd block's qs
    // are 4 aligned words: lane tig takes word tig (qs bytes 4 tig ..). An even block's start 2 bytes
    // into a word: lane tig > 0 takes the aligned word of qs bytes 4 tig - 2 .., lane 0 qs bytes 0, 1
    // (the word of d) and 14, 15 (the word of the next block's d). int8_tokens_lane_byte(u, b): where
    // qs byte b of block u lands, 4 tig + j (byte j of lane tig's word). The d's lie in words read
    // (each unit's whole scale: the row's chunk factor 1).
    // rows of `in` values whose chunks all lie whole on 16-byte boundaries (a 16-byte-aligned bank)
    static bool int8_tokens_rows(int in) { return in % 256 == 0; }
    __host__ __device__ static constexpr int int8_tokens_lane_byte(int u, int b) {
        const int t = (u & 1) ? b >> 2 : (b < 2 || b >= 14) ? 0 : (b + 2) >> 2;
        const int j = (u & 1) ? b & 3 : b < 2 ? b : b >= 14 ? b - 12 : (b + 2) & 3;
        return 4 * t + j;
    }
    __device__ static float int8_tokens_row(const uint8_t* row, int tig, uint32_t (&a)[8], float (&d)[8]) {
        const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row));
        uint32_t w[36];
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            const uint4 v = ld_shared_v4(s + 16 * i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
        // the lane's selectors: odd blocks word tig of the 4 (two PRMT and a select); even blocks
        // word tig of the 3 past the first, lane 0 the first's high half and the fifth's low half
        const uint32_t odd = (tig & 1) ? 0x7654u : 0x3210u;
        const uint32_t ex = tig == 0 ? 0x0032u : 0x7654u, ey = tig == 2 ? 0x3210u : 0x7654u;
        const uint32_t et = tig == 0 ? 0x5410u : 0x3210u;
        const bool upper = tig >= 2;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u & 1) {
                const int k = (9 * u + 1) / 2;  // the word of qs byte 0
                const uint32_t x = prmt(w[k], w[k + 1], odd), y = prmt(w[k + 2], w[k + 3], odd);
                a[u] = upper ? y : x;
                d[u] = half_bits(w[k - 1] >> 16);
            } else {
                const int k = 9 * u / 2;  // the word of d
                const uint32_t x = prmt(w[k], w[k + 1], ex), y = prmt(w[k + 2], w[k + 3], ey);
                a[u] = prmt(upper ? y : x, w[k + 4], et);
                d[u] = half_bits(w[k]);
            }
        }
        return 1.f;
    }
    __device__ static float split(const Raw& raw, uint32_t (&q)[4]) {
        uint32_t v[6], dq[1];
        span_words(raw.s, v);
        bytes_at<1, 6, true>(v, raw.o, dq);
        bytes_at<4, 8, true>(v, raw.o + 2, q);
        return half_bits(dq[0]);
    }
};

// value = d * (q - 8)
template <>
struct Fast<Q4_0> : Block18 {
    static constexpr bool kHas = true;
    // register-fed: H200, T=1, 0.46x of the ceiling; staged 0.42x (both as of kOptCopy32 |
    // kOptFull, docs/BENCHMARKS.md); staged on rings of 2 (kShortRing) where a phase has many items
    // (kStagedManyItems, staged_for_items): deepseek-v3 0.45x -> 0.54x (register-fed at the qwen3
    // size, 0.40x against 0.34x staged); on float32 sums of its blocks 0.49x / 0.32x (dropped)
    static constexpr bool kShortRing = true, kStagedManyItems = true;
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[4];
        const Scaled f(split(raw, q));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)  // values 4k.. (low nibbles), 16 + 4k.. (high)
                int_pairs((q[k] >> (4 * hi)) & 0x0F0F0F0Fu, bf16x2_biased(8), f, w + 8 * hi + 2 * k);
        }
    }
    // The staged kernel's byte columns at T = 1 (kOptByteCols): the values q - 8 (int_pairs without
    // its multiply: a PRMT and an HSUB2 per pair, no HMUL2), d on the unit's float32 sum. By default
    // where the staged kernel runs (kByteColsDefault), as measured on the H200 (docs/BENCHMARKS.md
    // "UC4"; T=1, x the ceiling): deepseek-v3 87.7 -> 84.9 us (0.54 -> 0.55); at the qwen3-30b-a3b
    // size the register-fed decode stays faster (18.3 us; staged 22.0, with byte columns 21.5).
    // Measured and dropped (commit 5a41aa6): the values 128 + q (a PRMT per pair) with the 136
    // taken off by 8 more mma of (-136, -136) against x per unit: 87.9 -> 91.2 us
    static constexpr bool kByteCols = true, kByteColsDefault = true;
    __device__ static float decode_cols(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[4];
        const float d = split(raw, q);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)  // values 4k.. (low nibbles), 16 + 4k.. (high)
                int_pairs((q[k] >> (4 * hi)) & 0x0F0F0F0Fu, bf16x2_biased(8), [](uint32_t v) { return v; },
                          w + 8 * hi + 2 * k);
        }
        return d;
    }
    // The staged kernel's int8 unit at T = 1 (kOptInt8, FTW_GGUF_CUDA_INT8): q as u8 (q - 8's 8
    // times the x group's sum taken off the integer sums), values 4 s .. 4 s + 3 (low nibbles of
    // word s) in a[2 s], 16 + 4 s .. (high) in a[2 s + 1]: x in its natural order
    static constexpr bool kInt8 = true, kInt8Interleaved = false, kInt8Default = true;
    static constexpr int kInt8Offset = 8;
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        uint32_t q[4];
        const float d = split(raw, q);
#pragma unroll
        for (int s = 0; s < 4; ++s) a[2 * s] = q[s] & 0x0F0F0F0Fu, a[2 * s + 1] = (q[s] >> 4) & 0x0F0F0F0Fu;
        return d;
    }
    // The staged kernel's int8 units at T = 2..8 (kOptInt8Tokens, FTW_GGUF_CUDA_INT8_T8): the lane's
    // words as Block18::int8_tokens_row picks them, the values as s8 16 (q - 8): (q << 4) ^ 0x80 per
    // byte, no offset (so no x group sums), the 16 on the chunk's x scale (kInt8TokensPost). Per unit
    // and row 3 PRMT (odd) or 4 (even) and 3 LOP3 / SHF, where the bf16 body took 8 PRMT, 8 HADD2,
    // 8 HMUL2 and 6 LDS.
    static constexpr bool kInt8Tokens = true;
    static constexpr float kInt8TokensPost = 1.f / 16;
    __host__ __device__ static constexpr int int8_tokens_slot(int u, int v) {
        return (v >> 4) * 16 + int8_tokens_lane_byte(u, v & 15);  // low nibble: value b, high: 16 + b
    }
    // (w & 0xF0F0F0F0) ^ 0x80808080 as one LOP3: the second constant in a register (the compiler
    // otherwise takes one LOP3 per constant)
    __device__ static uint32_t high_nibbles_s8(uint32_t w) {
        uint32_t r;
        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(r) : "r"(w), "n"(0xF0F0F0F0u), "r"(0x80808080u));
        return r;
    }
    __device__ static void int8_tokens_split(uint32_t w, uint32_t& lo, uint32_t& hi) {
        lo = high_nibbles_s8(w << 4);  // low nibbles: k 4 tig ..
        hi = high_nibbles_s8(w);       // high nibbles: k 16 + 4 tig ..
    }
};

// IQ4_NL's and IQ4_XS's int8 units at T = 2..8 (kOptInt8Tokens, FTW_GGUF_CUDA_INT8_T8): the levels as
// s8 (no offset, so no x group sums) by nibbles_u8 on the tables iq4nl_s8_* (gen_tables.py: every
// byte with bit 7 set, so a code of the other half selects 0xFF and the IADD3 gives the level itself):
// per word a LOP3 (the codes with bit 3 flipped), 2 SHF, 4 PRMT and 2 IADD3, where the split before
// (the levels + 128 by T = 1's tables iq4nl_i8_*, then a LOP3 per 4 values to s8) took 2 LOP3 more.
// H200, T = 8 same experts, deepseek-v3, one run (docs/BENCHMARKS.md "NL8"): IQ4_NL 118.5 -> 110.5 us,
// IQ4_XS 112.7 -> 107.2 (the T8 kernels 64-68 instructions shorter, IQ4_NL's spills 6 / 8 STL -> 0 / 5);
// commit 732bc3a has the split before behind FTW_GGUF_CUDA_IQ4_SPLIT=old.
// Byte i of nibbles_u8's A word is nibble i of its 16 bits: the qs byte at
// lane byte lb = 4 tig + j of the unit (the row read's placement) gives k 4 tig + 2 j + n (j = 0, 1;
// n = 0 low nibble, 1 high) or 16 + 4 tig + 2 (j - 2) + n (j = 2, 3). The decode's post (2^62 in
// kValueV1) on the chunk's x scale (kInt8TokensPost)
template <int F>
struct Iq4Int8Tokens {
    static constexpr bool kInt8Tokens = true;
    static constexpr float kInt8TokensPost = F == kValueV1 ? 1.f / kTwo62 : 1.f;
    // the slot of value v (low nibble of qs byte v & 15, high for v >= 16) whose byte lands at lane byte lb
    __host__ __device__ static constexpr int int8_tokens_slot_at(int lb, int v) {
        const int j = lb & 3;
        return (j >= 2 ? 16 : 0) + (lb & ~3) + 2 * (j & 1) + (v >> 4);
    }
    __device__ static void int8_tokens_split(uint32_t w, uint32_t& lo, uint32_t& hi) {
        nibbles_u8<tb::iq4nl_s8_lo_word0, tb::iq4nl_s8_lo_word1, tb::iq4nl_s8_hi_word0, tb::iq4nl_s8_hi_word1, true>(w, lo, hi);
    }
};

// value = d * kvalues_iq4nl[q], made the form F way (ValueForm)
template <int F>
struct Iq4NlFast : Block18, Iq4Values<F>, Iq4Int8Tokens<F> {
    static constexpr bool kHas = true;
    // register-fed: H200, T=1, 0.36x of the ceiling; staged 0.26x, with rings of 2 stages
    // (kShortRing) 0.33x; on float32 sums of its blocks 0.31x (dropped) (all kValueV0). With
    // kValueV1 register-fed 0.41x (0.36x in the same run; qwen3-30b-a3b size 0.36x against 0.33x),
    // staged 0.40x (T=8 same: staged 0.38x, register-fed 0.35x), so still register-fed
    static constexpr bool kShortRing = true;
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[4];
        const float d = split(raw, q);
        Iq4Values<F>::values(q, d, w);
    }
    // the staged kernel's int8 unit at T = 1 (kOptInt8): the levels + 128 (iq4nl_u8), d over the
    // decode's post (2^62 in kValueV1) on the integer sums
    static constexpr bool kInt8 = true, kInt8Interleaved = true, kInt8Default = true;
    static constexpr int kInt8Offset = 128;
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        uint32_t q[4];
        const float d = split(raw, q);
        iq4nl_u8(q, a);
        return F == kValueV1 ? d * (1.f / kTwo62) : d;
    }
    // The staged kernel's int8 units at T = 2..8 (kOptInt8Tokens): the lane's words as
    // Block18::int8_tokens_row picks them, split as Iq4Int8Tokens says
    __host__ __device__ static constexpr int int8_tokens_slot(int u, int v) {
        return Iq4Int8Tokens<F>::int8_tokens_slot_at(int8_tokens_lane_byte(u, v & 15), v);
    }
};
template <>
struct Fast<IQ4_NL> : Iq4NlFast<kValueV1> {};

// e:e8m0 | qs[16]; 17-byte blocks, any alignment. e2m1 * 2^(e-127) is exact in bf16, so the
// values are made as the mxfp4 format's are (bf16 bit tricks, weights * 2^-62, post 2^62); exact
// for e in 63..190 (real checkpoints sit near 120). Nibble order as Q4_0 (value j: low nibble of
// byte j, j + 16: high), which e2m1x8_raw turns into the pairs permute() matches.
template <int F>
struct Mxfp4Fast : WholeBlock<17, 1> {
    static constexpr bool kHas = true;
    static constexpr int kValueForm = F;
    // register-fed: H200, T=1, 0.42x of the ceiling; staged 0.34x, with rings of 2 stages
    // (kShortRing) 0.42x, T=8 same 0.38x against 0.35x: staged where a phase has many items
    // (kStagedManyItems, staged_for_items; register-fed at the qwen3 size: 0.38x against 0.30x)
    // (all kValueV0); with kValueV1 staged 0.44x at deepseek-v3 (0.42x in the same run), 0.38x at
    // the qwen3-30b-a3b size (register-fed, unchanged)
    static constexpr bool kShortRing = true, kStagedManyItems = true;
    static constexpr float kPost = kTwo62;
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t v[6], e[1], q[4];
        span_words(raw.s, v);
        bytes_at<1, 7, true>(v, raw.o, e);
        bytes_at<4, 8, true>(v, raw.o + 1, q);
        // 2^(e-127) * 2^64 in both halves: with e2m1's 2^-126, w * 2^-62 (the same bits either way)
        uint32_t m2;
        if constexpr (F == kValueV1) {
            m2 = e8m0_bf16x2(e[0] & 0xFFu, 64);
        } else {
            const uint32_t m = e8m0_bf16(e[0] & 0xFFu, 64);
            m2 = m | (m << 16);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t t[4];  // (v4i, v4i+2), (v4i+16, v4i+18), (v4i+1, v4i+3), (v4i+17, v4i+19)
            if constexpr (F == kValueV1)
                e2m1x8_raw_mul(q[i], t);  // e2m1x8_raw's bits, its shifts by one multiply per pair
            else
                e2m1x8_raw(q[i], t);
#pragma unroll
            for (int k = 0; k < 4; ++k) w[4 * i + k] = hmul2(t[k], m2);
        }
    }
    // The staged kernel's byte columns at T = 1 (kOptByteCols): e2m1 * 2^-126 (e2m1x8_raw_mul, the
    // same bits in either form) against x * 2^kUnitColsX give sum e2m1 x * 2^-69; the decode's
    // weights are e2m1 * 2^(e - 127) * 2^-62, so the unit's scale is 2^(e - 120), exact for e <= 247
    // (255 is not a number). By default where the staged kernel runs (kByteColsDefault), as measured
    // on the H200 (docs/BENCHMARKS.md "UC4"; T=1): deepseek-v3 102.8 -> 101.8 us and 102.7 -> 101.7
    // in two runs (0.44x the ceiling either way); at the qwen3-30b-a3b size the register-fed decode
    // stays faster (18.9 us; staged 24.0, with byte columns 23.7)
    static constexpr bool kByteCols = true, kByteColsX = true, kByteColsDefault = true;
    __device__ static float decode_cols(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t v[6], e[1], q[4];
        span_words(raw.s, v);
        bytes_at<1, 7, true>(v, raw.o, e);
        bytes_at<4, 8, true>(v, raw.o + 1, q);
        e2m1_unit_raw(make_uint4(q[0], q[1], q[2], q[3]), w);
        static_assert(kUnitColsX == 57, "2^(e - 127 - 62 + 126 - 57)");
        return __uint_as_float((min(e[0] & 0xFFu, 247u) + 7u) << 23);
    }
    // The staged kernel's int8 unit at T = 1 (kOptInt8): e2m1 doubled (mxfp4_values: 0, 1, 2, 3, 4,
    // 6, 8, 12 and their negatives) + 128 by nibbles_u8; the scale 2^(e - 128) over the post 2^62,
    // 2^(e - 190) (0 for e < 64, weights below 2^-64; exact above)
    static constexpr bool kInt8 = true, kInt8Interleaved = true, kInt8Default = true;
    static constexpr int kInt8Offset = 128;
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        uint32_t v[6], e[1], q[4];
        span_words(raw.s, v);
        bytes_at<1, 7, true>(v, raw.o, e);
        bytes_at<4, 8, true>(v, raw.o + 1, q);
#pragma unroll
        for (int s = 0; s < 4; ++s)
            nibbles_u8<tb::mxfp4_i8_lo_word0, tb::mxfp4_i8_lo_word1, tb::mxfp4_i8_hi_word0, tb::mxfp4_i8_hi_word1,
                       tb::mxfp4_i8_lo_negative>(q[s], a[2 * s], a[2 * s + 1]);
        const uint32_t ex = e[0] & 0xFFu;
        return ex >= 64u ? __uint_as_float((ex - 63u) << 23) : 0.f;
    }
    // x's pairs X[m] = (x_2m, x_2m+1) into decode's order above
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            a[4 * i] = prmt(x[2 * i], x[2 * i + 1], 0x5410);
            a[4 * i + 1] = prmt(x[2 * i + 8], x[2 * i + 9], 0x5410);
            a[4 * i + 2] = prmt(x[2 * i], x[2 * i + 1], 0x7632);
            a[4 * i + 3] = prmt(x[2 * i + 8], x[2 * i + 9], 0x7632);
        }
    }
};
template <>
struct Fast<MXFP4> : Mxfp4Fast<kValueV1> {};
template <int F>
struct Fast<WithValues<MXFP4, F>> : Mxfp4Fast<F> {};

// d:f16 | scales_h:u16 | scales_l[4] | qs[128]; 136-byte blocks, 8-byte aligned: the 8-byte head
// and the sub-block's 16 nibble bytes
template <int F>
struct Iq4XsFast : Iq4Values<F>, Iq4Int8Tokens<F> {
    static constexpr bool kHas = true;
    // register-fed: H200, T=1, 0.35x of the ceiling; staged 0.28x, with rings of 2 stages
    // (kShortRing) 0.32x; on float32 sums of its sub-blocks 0.28x (dropped) (all kValueV0). With
    // kValueV1 register-fed 0.42x (0.35x in the same run; qwen3-30b-a3b size 0.38x against 0.33x),
    // staged 0.39x (T=8 same: staged 0.37x, register-fed 0.35x), so still register-fed
    static constexpr bool kShortRing = true;
    struct Raw {
        uint2 head, q0, q1;
        uint32_t j;
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 136;
        const int j = u & 7;
        const uint2* q = reinterpret_cast<const uint2*>(b + 8 + 16 * j);
        return {M::stream8(b), M::stream8(q), M::stream8(q + 1), uint32_t(j)};
    }
    // sub-block j's scale, d * (ls - 32), ls its 6 bits (4 in scales_l, 2 in scales_h)
    __device__ static float sub_block_scale(const Raw& raw) {
        const int j = int(raw.j);
        const float d = half_bits(raw.head.x);
        const int ls = int(((raw.head.y >> (4 * j)) & 15) | ((raw.head.x >> (16 + 2 * j)) & 3) << 4);
        return d * float(ls - 32);
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t q[4] = {raw.q0.x, raw.q0.y, raw.q1.x, raw.q1.y};
        Iq4Values<F>::values(q, sub_block_scale(raw), w);
    }
    // the staged kernel's int8 unit at T = 1 (kOptInt8), as IQ4_NL's with the sub-block's d * (ls - 32)
    static constexpr bool kInt8 = true, kInt8Interleaved = true, kInt8Default = true;
    static constexpr int kInt8Offset = 128;
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        const float dl = sub_block_scale(raw);
        const uint32_t q[4] = {raw.q0.x, raw.q0.y, raw.q1.x, raw.q1.y};
        iq4nl_u8(q, a);
        return F == kValueV1 ? dl * (1.f / kTwo62) : dl;
    }
    // The staged kernel's int8 units at T = 2..8 (kOptInt8Tokens): a chunk is one 136-byte block,
    // 8-byte aligned wherever it starts (rows of whole blocks on a 16-byte-aligned bank), so any row
    // of whole chunks. Unit u's qs are the aligned words 2 + 4 u .. 5 + 4 u of the chunk: lane tig
    // reads word 2 + 4 u + tig by one LDS.32 (qs byte b of the unit at lane byte b; a warp's 32 reads
    // of a unit fall in 32 banks: rows g at the stage's pitch of 9 x 16 bytes, 4 g banks apart),
    // the head (d, scales_h, scales_l) by one LDS.64 (a broadcast per quad). The units' scales
    // ls - 32 as integers (kInt8TokensIntScales: the kernel multiplies the planes' int32 sums), d
    // the row's chunk factor (one multiply per chunk, not per unit). H200, T = 8 same experts
    // (docs/BENCHMARKS.md "T8X"): deepseek-v3 124.3 -> 113.0 us (T = 8 / T = 1 1.44 -> 1.31), so by
    // default in many-item phases as Q4_0's and IQ4_NL's; at the qwen3-30b-a3b size 23.3 -> 27.2.
    static constexpr bool kInt8TokensIntScales = true;
    static bool int8_tokens_rows(int in) { return in % 256 == 0; }
    __host__ __device__ static constexpr int int8_tokens_slot(int, int v) {
        return Iq4Int8Tokens<F>::int8_tokens_slot_at(v & 15, v);
    }
    __device__ static float int8_tokens_row(const uint8_t* row, int tig, uint32_t (&a)[8], int (&ls)[8]) {
        const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row));
        const uint2 head = ld_shared_v2(s);  // d | scales_h << 16, scales_l
#pragma unroll
        for (int u = 0; u < 8; ++u) a[u] = ld_shared_u32(s + 8 + 16 * u + 4 * tig);
        // the 6-bit ls of units 2 k (even) and 2 k + 1 (odd) in byte k: the low 4 bits are
        // scales_l's nibbles; the high 2 are scales_h's bits 2 u, picked from t = its bytes
        // (b0, b0, b1, b1), where unit 2 k's sit at bits 4 (k & 1) of byte k, unit 2 k + 1's 2 above
        const uint32_t t = prmt(head.x, 0u, 0x3322u);
        const uint32_t even = (head.y & 0x0F0F0F0Fu) | ((t << 4) & 0x00300030u) | (t & 0x30003000u);
        const uint32_t odd = ((head.y >> 4) & 0x0F0F0F0Fu) | ((t << 2) & 0x00300030u) | ((t >> 2) & 0x30003000u);
        // ls - 32 as s8 bytes: x = ls ^ 32 is ls - 32 where ls >= 32, ls + 32 (bit 5 set) below,
        // where x + 6 * 32 = ls - 32 + 256 (no carry out of a byte: x + 192 <= 255)
        auto s8 = [](uint32_t v) {
            const uint32_t x = v ^ 0x20202020u;
            return x + (x & 0x20202020u) * 6u;
        };
        const uint32_t se = s8(even), so = s8(odd);
        // byte u / 2 of se / so, sign-extended (prmt's sign mode: selector bit 3)
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t k = uint32_t(u >> 1), x = k | 8u;
            ls[u] = int(prmt(u & 1 ? so : se, 0u, k | x << 4 | x << 8 | x << 12));
        }
        return half_bits(head.x);
    }
};
template <>
struct Fast<IQ4_XS> : Iq4XsFast<kValueV1> {};
// rows of IQ4_NL / IQ4_XS with their values made the other way (FTW_GGUF_CUDA_VALUES, with_form)
template <int F>
struct Fast<WithValues<IQ4_NL, F>> : Iq4NlFast<F> {};
template <int F>
struct Fast<WithValues<IQ4_XS, F>> : Iq4XsFast<F> {};

// ---- Q4_K / Q5_K on float32 sub-block sums (the staged kernel's kSubBlocks interface) ---------
//
// experts_decode_staged (csrc/cuda/experts_kernels.cuh, staged_sub_block_chunk) puts the quants in
// the mma as the exact bf16 integers 128 + q (int_pairs' magic: one prmt makes a pair, after a
// mask, or a shift and a mask, per 4 values) and applies each sub-block's scale and min to the
// float32 sums: the sub-block's share of a row's dot is s * P + n * X with P = sum (128 + q) x,
// X = sum x, s = d * sc and n = -(128 s + dmin * mn). s and dmin * mn are ggml's float32 values,
// so no weight is rounded at all (the bf16 decoders round each value, ShiftedMin / ScaledMin).
// The head's 16 bytes: d and dmin, and the sixteen 6-bit scales and mins cut a byte each (as
// k4_scale_min: sub-blocks 0..3 in sc[0] / mn[0], 4..7 in sc[1] / mn[1]).
template <int W>
struct KHeadOf {
    float d, d128, m, m128;  // d, -128 d, dmin, 128 dmin
    uint32_t sc[W], mn[W];   // sub-block j's scale and min: byte j % 4 of sc[j / 4], mn[j / 4]
};
using KHead = KHeadOf<2>;
__device__ __forceinline__ KHead k_head(const uint8_t* b) {
    const uint4 h = *reinterpret_cast<const uint4*>(b);  // the block starts on 16 bytes (144, 176)
    KHead r;
    r.d = half_bits(h.x), r.m = half_bits(h.x >> 16);
    r.d128 = -128.f * r.d, r.m128 = 128.f * r.m;
    r.sc[0] = h.y & 0x3F3F3F3Fu, r.mn[0] = h.z & 0x3F3F3F3Fu;
    r.sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    r.mn[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    return r;
}
// 128 + byte k of x (bytes < 128) as a float, exactly: the bf16 pair of bytes k & 2, (k & 2) + 1
// under int_pairs' magic (one prmt, shared by k and k ^ 1), then its half k & 1 (k a constant
// after unrolling; a float magic 2^23 + byte per value took a prmt and a move of its selector)
__device__ __forceinline__ float biased_byte(uint32_t x, int k) {
    const uint32_t p = prmt(x, 0x43u, (k & 2) ? 0x4342u : 0x4140u);
    return __uint_as_float((k & 1) ? p & 0xFFFF0000u : p << 16);
}
// sub-block j's s and n (j a constant after unrolling): fma(d, 128 + sc, -128 d) is d * sc
// rounded once, as ggml's float32 product (likewise dmin * mn)
template <int W>
__device__ __forceinline__ void k_sub_scale(const KHeadOf<W>& h, int j, float& s, float& n) {
    s = fmaf(h.d, biased_byte(h.sc[j >> 2], j & 3), h.d128);
    n = fmaf(-128.f, s, fmaf(-h.m, biased_byte(h.mn[j >> 2], j & 3), h.m128));
}

// The lane-blocks interface (kOptLaneBlocks: staged_sub_block_lanes) of Q4_K / Q5_K: lane tig's
// sub-blocks 2 tig and 2 tig + 1 (bytes 2 (tig & 1), + 1 of k_head's sc[tig >> 1] and mn[tig >> 1])
// as the bf16 pairs (128 + sc, 128 + sc') and (128 + mn, 128 + mn'), one prmt each; lane_scale
// gives k_sub_scale's s and n from them (the same float32 arithmetic)
struct KLaneHead {
    float d, d128, m, m128;  // as KHeadOf
    uint32_t sc, mn;
};
__device__ __forceinline__ KLaneHead k_lane_head(const uint8_t* b, int tig) {
    const uint4 h = *reinterpret_cast<const uint4*>(b);
    KLaneHead r;
    r.d = half_bits(h.x), r.m = half_bits(h.x >> 16);
    r.d128 = -128.f * r.d, r.m128 = 128.f * r.m;
    const uint32_t sc = tig < 2 ? h.y & 0x3F3F3F3Fu : (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    const uint32_t mn = tig < 2 ? h.z & 0x3F3F3F3Fu : ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    const uint32_t sel = (tig & 1) ? 0x4342u : 0x4140u;
    r.sc = prmt(sc, 0x43u, sel), r.mn = prmt(mn, 0x43u, sel);
    return r;
}
__device__ __forceinline__ void k_lane_scale(const KLaneHead& h, int e, float& s, float& n) {
    const float sc = __uint_as_float(e ? h.sc & 0xFFFF0000u : h.sc << 16);
    const float mn = __uint_as_float(e ? h.mn & 0xFFFF0000u : h.mn << 16);
    s = fmaf(h.d, sc, h.d128);
    n = fmaf(-128.f, s, fmaf(-h.m, mn, h.m128));
}
// kOptInt8Sums (the q unbiased): sub-block 2 tig + e's s = d * sc and m = dmin * mn, each rounded once
// as ggml's float32 product
__device__ __forceinline__ void k_lane_scale_min(const KLaneHead& h, int e, float& s, float& m) {
    const float sc = __uint_as_float(e ? h.sc & 0xFFFF0000u : h.sc << 16);
    const float mn = __uint_as_float(e ? h.mn & 0xFFFF0000u : h.mn << 16);
    s = fmaf(h.d, sc, h.d128);
    m = fmaf(h.m, mn, -h.m128);
}
// kOptInt8Sums' A words of the nibbles of 8 words w (a sub-block pair's 32 bytes as decode_pair's:
// sub-block 2c low nibbles, 2c + 1 high): a[e][i] values 4 i .. 4 i + 3 (word i), the low nibbles
// by a mask, the high ones by a mask alone, in place, as 16 q (<= 240: a u8; the scale takes the
// 1 / 16)
__device__ __forceinline__ void k_nibbles_u8(const uint32_t (&w)[8], uint32_t (&a)[2][8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) a[0][i] = w[i] & 0x0F0F0F0Fu, a[1][i] = w[i] & 0xF0F0F0F0u;
}

// bytes of values (< 128) lo (sub-block 2c) and hi (2c + 1) -> the bf16 pairs (128 + v0, 128 + v1),
// (128 + v2, 128 + v3) of each, at w[.][2i], w[.][2i + 1]
__device__ __forceinline__ void k_int_pairs(uint32_t lo, uint32_t hi, int i, uint32_t (&w)[2][4]) {
    w[0][2 * i] = prmt(lo, 0x43u, 0x4140u), w[0][2 * i + 1] = prmt(lo, 0x43u, 0x4342u);
    w[1][2 * i] = prmt(hi, 0x43u, 0x4140u), w[1][2 * i + 1] = prmt(hi, 0x43u, 0x4342u);
}
// v shifted left by n bits (right by -n), n a constant after unrolling
__device__ __forceinline__ uint32_t shift_by(uint32_t v, int n) { return n >= 0 ? v << n : v >> -n; }

// d | dmin | scales[12] | qs[128]; 144-byte blocks, 16-byte aligned: the 16-byte head and the 32
// bytes of nibbles of the unit's sub-block pair (sub-block 2c: low nibbles, 2c + 1: high)
template <int Form>
struct Q4KFast {
    static constexpr int kMinForm = Form;
    template <int F>
    using WithForm = Q4KFast<F>;
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.25x of the ceiling; loaded 0.22x
    // H200: 0.31x (ScaledMin), faster than both; 0.42x with ShiftedMin; 0.50x on float32 sub-block
    // sums (SubBlockRows, 2 stages)
    static constexpr bool kStaged = true;
    struct Raw {
        uint4 head, q0, q1;
        uint32_t j;
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 144;
        const int j = u & 7;
        const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (j >> 1));
        return {M::cached16(b), M::stream16(q), M::stream16(q + 1), uint32_t(j)};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const int j = int(raw.j);
        uint32_t sc, mn;
        k4_head_scale_min(raw.head, j, sc, mn);
        const float d1 = half_bits(raw.head.x) * float(sc), m1 = half_bits(raw.head.x >> 16) * float(mn);
        const int shift = 4 * (j & 1);  // sub-block 2c: low nibbles, 2c + 1: high
        const uint32_t qs[8] = {raw.q0.x, raw.q0.y, raw.q0.z, raw.q0.w, raw.q1.x, raw.q1.y, raw.q1.z, raw.q1.w};
        uint32_t q[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = (qs[k] >> shift) & 0x0F0F0F0Fu;
        k_values(q, MinOf<Form>(d1, m1), w);
    }
    // the staged kernel's sub-block interface (above): bytes 8 tig .. 8 tig + 7 of the sub-block
    // pair's 32 nibble bytes
    static constexpr bool kSubBlocks = true;
    using Head = KHead;
    __device__ static Head head(const uint8_t* b) { return k_head(b); }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) { k_sub_scale(h, j, s, n); }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][4]) {
        const uint2 q = *reinterpret_cast<const uint2*>(b + 16 + 32 * c2 + 8 * tig);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t x = i ? q.y : q.x;
            k_int_pairs(x & 0x0F0F0F0Fu, (x >> 4) & 0x0F0F0F0Fu, i, w);
        }
    }
    // the lane-blocks interface (above k_lane_head): sub-blocks 2 tig, 2 tig + 1 are the nibbles of
    // nibble bytes 32 tig .., values 8 p .. 8 p + 7 of each decode_pair's bytes 8 p .. of pair tig
    static constexpr bool kLaneBlocks = true;
    __device__ static KLaneHead lane_head(const uint8_t* b, int tig) { return k_lane_head(b, tig); }
    __device__ static void lane_scale(const KLaneHead& h, int e, float& s, float& n) { k_lane_scale(h, e, s, n); }
    __device__ static void decode_lane(const uint8_t* b, int tig, int p, uint32_t (&w)[2][4]) { decode_pair(b, tig, p, w); }
    // the int8 lane interface (kOptInt8Sums: staged_sub_block_int8): the q of sub-blocks 2 tig, 2 tig + 1
    // are the low and high nibbles of nibble bytes 32 tig .. 32 tig + 31, a mask per 4 values: the
    // high ones in place, as 16 q, so sub-block 2 tig + 1's d sc comes over 16 (exact)
    static constexpr bool kInt8Sums = true;
    __device__ static void lane_scale_min(const KLaneHead& h, int e, float& s, float& m) {
        k_lane_scale_min(h, e, s, m);
        if (e) s *= 0.0625f;
    }
    __device__ static void decode_lane_int8(const uint8_t* b, int tig, uint32_t (&a)[2][8]) {
        const uint4 q0 = *reinterpret_cast<const uint4*>(b + 16 + 32 * tig), q1 = *reinterpret_cast<const uint4*>(b + 32 + 32 * tig);
        k_nibbles_u8({q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w}, a);
    }
};
template <>
struct Fast<Q4_K> : Q4KFast<kMinShift> {};

// d | dmin | scales[12] | qh[32] | qs[128]; 176-byte blocks, 16-byte aligned: the head, the 32
// nibble bytes as Q4_K and the 32 bytes of fifth bits (bit j of qh[l]: value 32j + l)
template <int Form>
struct Q5KFast {
    static constexpr int kMinForm = Form;
    template <int F>
    using WithForm = Q5KFast<F>;
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.27x of the ceiling; loaded 0.13x (ScaledOffset)
    // H200: 0.30x (0.43x with ScaledOffset), faster than both; 0.53x on float32 sub-block sums
    // (SubBlockRows, 2 stages)
    static constexpr bool kStaged = true;
    struct Raw {
        uint4 head, q0, q1, h0, h1;
        uint32_t j;
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 176;
        const int j = u & 7;
        const uint4* q = reinterpret_cast<const uint4*>(b + 48 + 32 * (j >> 1));
        const uint4* h = reinterpret_cast<const uint4*>(b + 16);
        return {M::cached16(b), M::stream16(q), M::stream16(q + 1), M::cached16(h), M::cached16(h + 1), uint32_t(j)};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const int j = int(raw.j);
        uint32_t sc, mn;
        k4_head_scale_min(raw.head, j, sc, mn);
        const float d1 = half_bits(raw.head.x) * float(sc), m1 = half_bits(raw.head.x >> 16) * float(mn);
        const uint32_t qs[8] = {raw.q0.x, raw.q0.y, raw.q0.z, raw.q0.w, raw.q1.x, raw.q1.y, raw.q1.z, raw.q1.w};
        const uint32_t qh[8] = {raw.h0.x, raw.h0.y, raw.h0.z, raw.h0.w, raw.h1.x, raw.h1.y, raw.h1.z, raw.h1.w};
        const int shift = 4 * (j & 1), rot = (4 - j) & 31;  // bit j of a qh byte -> bit 4
        uint32_t q[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            q[k] = ((qs[k] >> shift) & 0x0F0F0F0Fu) | (__funnelshift_l(qh[k], qh[k], rot) & 0x10101010u);
        k_values(q, MinOf<Form>(d1, m1), w);
    }
    // the staged kernel's sub-block interface (above, as Q4_K): bytes 8 tig .. 8 tig + 7 of the
    // pair's nibble bytes and of qh (bits 2 c2, 2 c2 + 1 to bit 4 of each byte)
    static constexpr bool kSubBlocks = true;
    using Head = KHead;
    __device__ static Head head(const uint8_t* b) { return k_head(b); }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) { k_sub_scale(h, j, s, n); }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][4]) {
        const uint2 q = *reinterpret_cast<const uint2*>(b + 48 + 32 * c2 + 8 * tig);
        const uint2 h = *reinterpret_cast<const uint2*>(b + 16 + 8 * tig);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t x = i ? q.y : q.x, y = i ? h.y : h.x;
            k_int_pairs((x & 0x0F0F0F0Fu) | (shift_by(y, 4 - 2 * c2) & 0x10101010u),
                        ((x >> 4) & 0x0F0F0F0Fu) | (shift_by(y, 3 - 2 * c2) & 0x10101010u), i, w);
        }
    }
    // the lane-blocks interface (as Q4_K's): nibble bytes 32 tig + 8 p .., and qh bits 2 tig, 2 tig + 1
    // to bit 4 by a rotation (tig is not a constant; the bit stays in its byte, so no shift's sign)
    static constexpr bool kLaneBlocks = true;
    __device__ static KLaneHead lane_head(const uint8_t* b, int tig) { return k_lane_head(b, tig); }
    __device__ static void lane_scale(const KLaneHead& h, int e, float& s, float& n) { k_lane_scale(h, e, s, n); }
    __device__ static void decode_lane(const uint8_t* b, int tig, int p, uint32_t (&w)[2][4]) {
        const uint2 q = *reinterpret_cast<const uint2*>(b + 48 + 32 * tig + 8 * p);
        const uint2 h = *reinterpret_cast<const uint2*>(b + 16 + 8 * p);
        const uint32_t r = uint32_t(4 - 2 * tig) & 31u;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t x = i ? q.y : q.x, y = i ? h.y : h.x;
            k_int_pairs((x & 0x0F0F0F0Fu) | (__funnelshift_l(y, y, r) & 0x10101010u),
                        ((x >> 4) & 0x0F0F0F0Fu) | (__funnelshift_l(y, y, r - 1) & 0x10101010u), i, w);
        }
    }
    // the int8 lane interface (as Q4_K's): qh word i holds the fifth bits of the values of nibble word
    // i; one rotation (decode_lane's) puts sub-block 2 tig's at bit 4 and 2 tig + 1's at bit 5 of each
    // byte, so sub-block 2 tig's q are the low nibble | bit 4, and 2 tig + 1's enter as 2 q (<= 62),
    // the high nibble shifted to bits 1..4 | bit 5 (its d sc over 2, exact). By default at T = 1 (unlike
    // Q4_K's), as measured on the H200 (docs/BENCHMARKS.md "I8K", three runs, the lane-columns body in
    // the same run): deepseek-v3 95.9 / 95.1 / 95.2 -> 95.1 / 94.1 / 94.2 us, qwen3-30b-a3b 23.5 / 23.6 /
    // 23.5 -> 22.9 / 23.0 / 23.0 us (Q4_K: deepseek-v3 1.4% faster, qwen3-30b-a3b 2% slower)
    static constexpr bool kInt8Sums = true, kInt8Default = true;
    __device__ static void lane_scale_min(const KLaneHead& h, int e, float& s, float& m) {
        k_lane_scale_min(h, e, s, m);
        if (e) s *= 0.5f;
    }
    __device__ static void decode_lane_int8(const uint8_t* b, int tig, uint32_t (&a)[2][8]) {
        const uint4 q0 = *reinterpret_cast<const uint4*>(b + 48 + 32 * tig), q1 = *reinterpret_cast<const uint4*>(b + 64 + 32 * tig);
        const uint4 h0 = *reinterpret_cast<const uint4*>(b + 16), h1 = *reinterpret_cast<const uint4*>(b + 32);
        const uint32_t qs[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const uint32_t qh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t r = uint32_t(4 - 2 * tig) & 31u;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t t = __funnelshift_l(qh[i], qh[i], r);
            a[0][i] = (qs[i] & 0x0F0F0F0Fu) | (t & 0x10101010u);
            a[1][i] = ((qs[i] >> 3) & 0x1E1E1E1Eu) | (t & 0x20202020u);
        }
    }
};
template <>
struct Fast<Q5_K> : Q5KFast<kMinHiLo> {};

// ---- Q2_K / Q3_K / Q6_K on float32 sub-block sums: 16-value sub-blocks (kSubBlockValues) -------
//
// As Q4_K / Q5_K above, with a sub-block per k16 step: lane tig decodes values 4 tig .. 4 tig + 3
// and 16 + 4 tig .. 16 + 4 tig + 3 of each 32-value unit, 4 bytes of each byte plane (qs, ql, qh,
// hmask) that the unit's values share; a byte's 2 or 4 quant bits of the unit are shifted into
// place, masked, and two prmt make the bf16 pairs 128 + q. Q2_K's mins take the X way
// (n = -(128 s + dmin m)); Q3_K and Q6_K have none (kSubBlockMins false): their offset (4, 32) is
// one integer for every sub-block, taken off each pair by a bf16 sub (exact), so the mma sums the
// signed quants. (Taken off P by an mma with a row of -(128 + offset) instead, the constant's four
// registers were moved into place before each use under the kernel's 128 registers: 4 moves and
// an mma per sub-block against 4 subs.) Every scale is ggml's own float32 product d * sc (exact:
// an f16 times a 4-, 6- or 8-bit integer).

// the 4 bytes at byte o (a multiple of 4) of a block at a 2-byte-aligned address b of the ring
// (Q3_K, Q6_K): the two aligned words around them, shifted (pointer arithmetic rounds b down, so
// the loads stay ld.shared)
struct Ring2 {
    const uint32_t* a;
    uint32_t sh;
    __device__ explicit Ring2(const uint8_t* b)
        : a(reinterpret_cast<const uint32_t*>(b - addr_low(b, 2))), sh(addr_low(b, 2) * 8) {}
    __device__ uint32_t word(int o) const { return __funnelshift_r(a[o >> 2], a[(o >> 2) + 1], sh); }
    // the f16 at byte o (a multiple of 4), from the one word holding it (a block's last two bytes:
    // nothing read past them)
    __device__ float half(int o) const { return half_bits(a[o >> 2] >> sh); }
};
// Ring2's interface for a block known to start on a 4-byte boundary (Q3_K's aligned chunks,
// kAligned4): each word one load, no shift
struct Ring4 {
    const uint32_t* a;
    __device__ explicit Ring4(const uint8_t* b) : a(reinterpret_cast<const uint32_t*>(b)) {}
    __device__ uint32_t word(int o) const { return a[o >> 2]; }
    __device__ float half(int o) const { return half_bits(a[o >> 2]); }
};

// four bytes of x (< 128) as the bf16 pairs (128 + x0, 128 + x1), (128 + x2, 128 + x3)
__device__ __forceinline__ void biased_pairs(uint32_t x, uint32_t* w) {
    w[0] = prmt(x, 0x43u, 0x4140u), w[1] = prmt(x, 0x43u, 0x4342u);
}
// the same less 128 + off (B = bf16x2_biased(off)): the exact signed integers x - off
__device__ __forceinline__ void signed_pairs(uint32_t x, uint32_t B, uint32_t* w) {
    w[0] = bsub2(prmt(x, 0x43u, 0x4140u), B), w[1] = bsub2(prmt(x, 0x43u, 0x4342u), B);
}

// ql[128] | qh[64] | scales:int8[16] | d:f16; 210-byte blocks, 2-byte aligned. Unit u = 4h + s of
// its block: 32 ql bytes at 64h + 32(s % 2) (nibble s / 2), 32 qh bytes at 128 + 32h (bits 2s,
// 2s + 1), scales 8h + 2s and 8h + 2s + 1, d; value = d * sc * (q - 32).
template <>
struct Fast<Q6_K> {
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.27x of the ceiling; loaded 0.10x
    // H200, T=1, staged: 0.27x (faster at T=8: 0.25x / 0.23x); 0.30x with ld.shared, 0.49x with a
    // ring of 2 stages (launch_decode); 0.58x on float32 sub-block sums (SubBlockRows); its scales
    // in units of d (unit_scale) 0.57x / 0.37x, as fast as d * sc per sub-block in the same run; at
    // T = 1 with lane blocks (decode_lane16, kOptLanes16) 0.61x / 0.37x against 0.59x / 0.36x
    static constexpr bool kStaged = true;
    struct Raw {
        Span<32, 2> ql, qh;
        uint32_t sc, d;  // the 4-byte words holding the unit's two scales and d
        uint32_t os;     // block address % 8 | s << 4 | (scale byte position) << 8 | (d's) << 12
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 210;
        const int h = (u >> 2) & 1, s = u & 3;
        const uint8_t* sc = b + 192 + 8 * h + 2 * s;
        const uint8_t* d = b + 208;
        const uint32_t os = span_offset<M>(b) | uint32_t(s) << 4 | addr_low(sc, 3) << 8 | addr_low(d, 3) << 12;
        return {load_span<32, 2, M>(b + 64 * h + 32 * (s & 1)), load_span<32, 2, M>(b + 128 + 32 * h),
                ld_word_at<M>(sc), ld_word_at<M>(d), os};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t o = raw.os & 7, s = (raw.os >> 4) & 3;
        uint32_t lw[10], hw[10], ql[8], qh[8];
        span_words(raw.ql, lw);
        span_words(raw.qh, hw);
        bytes_at<8, 6, true>(lw, o, ql);
        bytes_at<8, 6, true>(hw, o, qh);
        const uint32_t scw = raw.sc >> (8 * ((raw.os >> 8) & 3));
        const float d = half_bits(raw.d >> (8 * ((raw.os >> 12) & 3)));
        const Scaled f0(d * float(int8_t(scw & 0xFF))), f1(d * float(int8_t((scw >> 8) & 0xFF)));
        const int shift = 4 * int(s >> 1), rot = int(4 - 2 * s) & 31;  // bits 2s, 2s + 1 -> 4, 5
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t x = ((ql[k] >> shift) & 0x0F0F0F0Fu) | (__funnelshift_l(qh[k], qh[k], rot) & 0x30303030u);
            int_pairs(x, bf16x2_biased(32), k < 4 ? f0 : f1, w + 2 * k);
        }
    }
    // the staged kernel's sub-block interface (16-value sub-blocks, q - 32): for units 2 c2 + e
    // (h = c2 / 2, s = 2 (c2 % 2) + e) nibble c2 % 2 of the ql words at 64h + 32e + 4 tig (+ 16),
    // bits 2s, 2s + 1 of the qh words at 128 + 32h + 4 tig (+ 16) to bits 4, 5
    static constexpr bool kSubBlocks = true;
    static constexpr int kSubBlockValues = 16;
    static constexpr bool kSubBlockMins = false;
    struct Head {
        float d;
        uint32_t sc[4];  // scale j: int8 byte j % 4 of sc[j / 4]
    };
    __device__ static Head head(const uint8_t* b) {
        const Ring2 r(b);
        return {r.half(208), {r.word(192), r.word(196), r.word(200), r.word(204)}};
    }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) {
        s = h.d * float(int8_t(h.sc[j >> 2] >> (8 * (j & 3))));  // exact: an f16 times an int8
        n = 0.f;
    }
    // d once per chunk (kUnitScales, SubBlockRows with FTW_GGUF_CUDA_CHUNK_D, the default): scale j
    // as the exact float of its int8, the chunk's sums times d once (no multiply per sub-block)
    __device__ static float unit_scale(const Head& h, int j) { return float(int8_t(h.sc[j >> 2] >> (8 * (j & 3)))); }
    __device__ static float head_d(const Head& h) { return h.d; }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][4]) {
        const Ring2 r(b);
        const int h = c2 >> 1, nib = 4 * (c2 & 1);
        const uint32_t qh[2] = {r.word(128 + 32 * h + 4 * tig), r.word(128 + 32 * h + 16 + 4 * tig)};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint32_t ql = r.word(64 * h + 32 * e + 16 * t + 4 * tig);
                signed_pairs(((ql >> nib) & 0x0F0F0F0Fu) | (shift_by(qh[t], 4 - 2 * s) & 0x30303030u),
                             bf16x2_biased(32), w[e] + 2 * t);
            }
        }
    }
    // the lane-blocks interface of 16-value sub-blocks (kOptLanes16: staged_sub_block_lanes16): lane
    // tig's sub-blocks s = 0..3 are units s of half h = tig / 2, values 16 t .. 16 t + 15 (t = tig % 2):
    // step i's quants from the qh word at 128 + 16 tig + 4 i (bits 2s, 2s + 1) and the ql words at
    // 64h + 32 (s % 2) + 16 t + 4 i (nibble s / 2), as the pairs 128 + q (kLaneBias16: 128 + 32 off);
    // scales 8h + 2s + t, bytes t and t + 2 of the words at 192 + 8h and 196 + 8h
    static constexpr bool kLanes16 = true;
    static constexpr int kLaneBias16 = 160;
    struct LaneHead16 {
        float d;
        uint32_t sc;  // sub-block s's int8 scale in byte s
    };
    __device__ static LaneHead16 lane_head16(const uint8_t* b, int tig) {
        const Ring2 r(b);
        const int h = tig >> 1;
        return {r.half(208), prmt(r.word(192 + 8 * h), r.word(196 + 8 * h), (tig & 1) ? 0x7531u : 0x6420u)};
    }
    __device__ static float lane_scale16(const LaneHead16& h, int s) { return float(int8_t(h.sc >> (8 * s))); }
    __device__ static float lane_d16(const LaneHead16& h) { return h.d; }
    __device__ static void decode_lane16(const uint8_t* b, int tig, int i, uint32_t (&w)[4][2]) {
        // (each plane's words from a lane pointer, so consecutive steps share their aligned words)
        const Ring2 rh(b + 16 * tig), rl(b + 64 * (tig >> 1) + 16 * (tig & 1));
        const uint32_t qh = rh.word(128 + 4 * i), ql[2] = {rl.word(4 * i), rl.word(32 + 4 * i)};
#pragma unroll
        for (int s = 0; s < 4; ++s)
            biased_pairs(((ql[s & 1] >> (4 * (s >> 1))) & 0x0F0F0F0Fu) | (shift_by(qh, 4 - 2 * s) & 0x30303030u), w[s]);
    }
};

// scales[16] | qs[64] | d:f16 | dmin:f16; 84-byte blocks, 4-byte aligned. Unit u = 4h + s of its
// block: bits 2s, 2s + 1 of qs[32h + l]; scale bytes 8h + 2s (values 0..15), 8h + 2s + 1 (16..31):
// low nibble scale, high nibble min; value = d*sc * q - dmin*m.
template <int Form>
struct Q2KFast {
    static constexpr int kMinForm = Form;
    template <int F>
    using WithForm = Q2KFast<F>;
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.18x of the ceiling; loaded 0.15x
    static constexpr bool kStaged = true;    // H200: 0.17x (ScaledMin), faster than both; 0.24x with ShiftedMin
    // staged with its table of values (decode_tables): H200, T=1, 0.25x / 0.22x of the ceiling
    // (deepseek-v3 / qwen3-30b-a3b), 0.24x / 0.20x with ShiftedMin in the same run; on float32
    // sub-block sums (SubBlockRows, the default) 0.25x / 0.24x, the table 0.25x / 0.22x; with the
    // scales in the mma and the mins in a second chain (decode_scaled) 0.28x / 0.25x, against
    // 0.25x / 0.24x in the same run; with wide lanes (decode_wide) 0.31x / 0.27x against 0.27x /
    // 0.25x in one run; at T = 1 with lane blocks (decode_lane16, kOptLanes16) 0.40x / 0.31x
    // against 0.33x / 0.28x in one run
    static constexpr bool kTables = true;
    struct Raw {
        uint32_t q[8];
        uint32_t sc, dd;  // the word holding the unit's two scale bytes; d and dmin
        uint32_t s;
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 84;
        const int h = (u >> 2) & 1, s = u & 3;
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 16 + 32 * h);
        Raw r;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.q[i] = M::word(q + i);
        r.sc = ld_word_at<M>(b + 8 * h + 2 * s);
        r.dd = M::word(b + 80);
        r.s = uint32_t(s);
        return r;
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const int s = int(raw.s);
        const float d = half_bits(raw.dd), dmin = half_bits(raw.dd >> 16);
        const uint32_t scw = raw.sc >> (16 * (s & 1));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t sc = (scw >> (8 * half)) & 0xFFu;
            const MinOf<Form> f(d * float(sc & 15), dmin * float(sc >> 4));
#pragma unroll
            for (int k = 4 * half; k < 4 * half + 4; ++k)
                int_pairs((raw.q[k] >> (2 * s)) & 0x03030303u, f.b, f, w + 2 * k);
        }
    }
    // decode() by a table of values in registers (the staged kernel's TableLoads): a 16-value half
    // takes four values, ggml's float32 d*sc * q - dmin*m for q = 0..3 each rounded once to bf16
    // (the table-driven decoder's values), their low bytes in one word and high bytes in another;
    // a pair of quants then picks its two values with one prmt (selector q | (4 + q) << 4 per
    // value: one imad for four quants), where int_pairs takes a prmt, a sub and an fma per pair.
    __device__ static void decode_tables(const Raw& raw, uint32_t (&w)[16]) {
        const int s = int(raw.s);
        const float d = half_bits(raw.dd), dmin = half_bits(raw.dd >> 16);
        const uint32_t scw = raw.sc >> (16 * (s & 1));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t sc = (scw >> (8 * half)) & 0xFFu;
            const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
            // (dl * q is exact: an f16 times 4 + 2 bits, so one fma rounds as ggml's mul then sub)
            const uint32_t v01 = pack_bf16x2(-ml, __fsub_rn(dl, ml));
            const uint32_t v23 = pack_bf16x2(__fmaf_rn(dl, 2.f, -ml), __fmaf_rn(dl, 3.f, -ml));
            const uint32_t lo = prmt(v01, v23, 0x6420u), hi = prmt(v01, v23, 0x7531u);
#pragma unroll
            for (int k = 4 * half; k < 4 * half + 4; ++k) {
                const uint32_t sel = ((raw.q[k] >> (2 * s)) & 0x03030303u) * 0x11u + 0x40404040u;
                w[2 * k] = prmt(lo, hi, sel);  // values 4k, 4k + 1
                w[2 * k + 1] = prmt(lo, hi, sel >> 16);
            }
        }
    }
    // the staged kernel's sub-block interface (16-value sub-blocks with mins, the X way): for units
    // 2 c2 + e (h = c2 / 2, s = 2 (c2 % 2) + e) bits 2s, 2s + 1 of the qs words at 16 + 32h + 4 tig
    // (+ 16); the head's scale bytes split into their low (scale) and high (min) nibbles
    static constexpr bool kSubBlocks = true;
    static constexpr int kSubBlockValues = 16;
    using Head = KHeadOf<4>;
    __device__ static Head head(const uint8_t* b) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(b);  // the block starts on 4 bytes (84)
        Head r;
        r.d = half_bits(w[20]), r.m = half_bits(w[20] >> 16);
        r.d128 = -128.f * r.d, r.m128 = 128.f * r.m;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.sc[i] = w[i] & 0x0F0F0F0Fu, r.mn[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
        return r;
    }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) { k_sub_scale(h, j, s, n); }
    // d and dmin once per chunk (kScaledInts with mins, SubBlockRows with FTW_GGUF_CUDA_CHUNK_D, the
    // default): each pair the exact integer sc * q (<= 45) by one bf16 fma from 8 + q (as
    // Fast<Q3_K>::decode_scaled: fma(8 + q, sc, -8 sc)), the mins as the pairs (m, m) of a second mma
    // chain against x (each row's sum of m * x), d and dmin applied to the chunk's two sums once:
    // per sub-block and row a prmt, a sub and an fma (sc, -8 sc) and a prmt and a sub (m), where
    // sub_scale's way takes two scale bytes, 3 fma and 4 fma into the sums
    __device__ static float head_d(const Head& h) { return h.d; }
    __device__ static float head_dmin(const Head& h) { return h.m; }
    __device__ static uint32_t min_pair(const Head& h, int j) {
        return bsub2(prmt(h.mn[j >> 2], 0x43u, 0x4040u | uint32_t(j & 3) * 0x101u), bf16x2_biased(0));
    }
    // with wide lanes (decode_wide): the min of sub-block 4 c2 + 2 e + tig / 2, the lane's of unit 2 c2 + e
    __device__ static uint32_t min_pair_lane(const Head& h, int c2, int e, int tig) {
        return bsub2(prmt(h.mn[c2], 0x43u, (0x4040u | uint32_t(tig >> 1) * 0x101u) + 0x202u * uint32_t(e)),
                     bf16x2_biased(0));
    }
    __device__ static void decode_scaled(const uint8_t* b, const Head& hd, int c2, int tig, uint32_t (&w)[2][4]) {
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 16 + 32 * (c2 >> 1) + 4 * tig);
        const uint32_t qs[2] = {q[0], q[4]};
        constexpr uint32_t kM8 = 0xC100C100u, k1024 = 0x44804480u;  // -8, 1024
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * (2 * c2 + e) + t;
                const uint32_t B = prmt(hd.sc[j >> 2], 0x43u, 0x4040u | uint32_t(j & 3) * 0x101u);  // (128 + sc) x 2
                const uint32_t S = bsub2(B, bf16x2_biased(0)), C = bfma2(B, kM8, k1024);         // sc, -8 sc
                const uint32_t x = shift_by(qs[t], 4 - 2 * s) & 0x30303030u;
                w[e][2 * t] = bfma2(prmt(x, 0x41u, 0x4140u), S, C);
                w[e][2 * t + 1] = bfma2(prmt(x, 0x41u, 0x4342u), S, C);
            }
        }
    }
    // The staged kernel's wide lanes (kWideLanes; SubBlockRows with d once per chunk, unless
    // FTW_GGUF_CUDA_WIDE=0): lane tig decodes values 8 tig .. 8 tig + 7 of unit 2 c2 + e (h = c2 / 2,
    // s = 2 (c2 % 2) + e), from the two adjacent qs words at 16 + 32h + 8 tig, all in sub-block
    // 4 c2 + 2 e + tig / 2: one scale per unit and lane, its byte picked by a selector made once (a
    // prmt), its (T, C) by a sub and an fma, and each value pair the exact integer sc * q by one fma as
    // in decode_scaled. The quant bits stay in place for s < 3: bits 2s, 2s + 1 under the exponent of
    // bf16 8 are the pair 8 + q 2^(2s - 4), so T = sc 2^(4 - 2s) and C = -8 T (exact: a power of two
    // times sc <= 15; the prmt's exponent byte makes the pairs 2^k (128 + sc)) give sc * q with a mask
    // and no shift (s = 3 shifted down to bits 4, 5, T = sc). One min pair per unit (min_pair_lane).
    __device__ static void decode_wide(const uint8_t* b, const Head& hd, int c2, int tig, uint32_t (&w)[2][4]) {
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 16 + 32 * (c2 >> 1) + 8 * tig);
        const uint32_t qs[2] = {q[0], q[1]};
        const uint32_t sel = 0x4040u | uint32_t(tig >> 1) * 0x101u;  // the lane's byte of a pair of sub-blocks, twice
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
            const int k = s < 3 ? 4 - 2 * s : 0;  // T = sc 2^k
            const uint32_t B = prmt(hd.sc[c2], 0x43u + uint32_t(k / 2), sel + 0x202u * uint32_t(e));  // 2^k (128 + sc) x 2
            const uint32_t T = bsub2(B, bf16x2_pow2(7 + k));                                            // 2^k sc
            const uint32_t C = bfma2(B, bf16x2_pow2(3, true), bf16x2_pow2(10 + k));                      // -8 T
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint32_t x = s < 3 ? qs[t] & (0x03030303u << (2 * s)) : (qs[t] >> 2) & 0x30303030u;
                w[e][2 * t] = bfma2(prmt(x, 0x41u, 0x4140u), T, C);
                w[e][2 * t + 1] = bfma2(prmt(x, 0x41u, 0x4342u), T, C);
            }
        }
    }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][4]) {
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 16 + 32 * (c2 >> 1) + 4 * tig);
        const uint32_t qs[2] = {q[0], q[4]};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
#pragma unroll
            for (int t = 0; t < 2; ++t) biased_pairs((qs[t] >> (2 * s)) & 0x03030303u, w[e] + 2 * t);
        }
    }
    // the lane-blocks interface of 16-value sub-blocks (kOptLanes16: staged_sub_block_lanes16), as
    // Fast<Q6_K>'s: lane tig's sub-blocks s = 0..3 are units s of half h = tig / 2, values 16 t ..
    // 16 t + 15 (t = tig % 2): step i's quants are bits 2s, 2s + 1 of the qs word at 16 + 16 tig + 4 i,
    // left in place for s < 3 (s = 3 shifted down to bits 4, 5) as the pairs 128 + 4^s q (128 + 16 q),
    // the 4^-s in the float32 scale (exact); scale and min bytes 8h + 2s + t, bytes t and t + 2 of
    // the scale words 2h and 2h + 1. The scales are not in the mma, so no bf16 fma per pair
    static constexpr bool kLanes16 = true;
    static constexpr int kLaneBias16 = 128;
    struct LaneHead16 {
        float d, dmin;
        uint32_t sc;  // sub-block s's scale (low nibble) and min (high) in byte s
    };
    __device__ static LaneHead16 lane_head16(const uint8_t* b, int tig) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(b);  // the block starts on 4 bytes (84)
        const int h = tig >> 1;
        return {half_bits(w[20]), half_bits(w[20] >> 16), prmt(w[2 * h], w[2 * h + 1], (tig & 1) ? 0x7531u : 0x6420u)};
    }
    __device__ static float lane_scale16(const LaneHead16& h, int s) {
        return float((h.sc >> (8 * s)) & 15u) * (s == 0 ? 1.f : s == 1 ? 0.25f : 0.0625f);
    }
    __device__ static float lane_min16(const LaneHead16& h, int s) { return float((h.sc >> (8 * s + 4)) & 15u); }
    __device__ static float lane_d16(const LaneHead16& h) { return h.d; }
    __device__ static float lane_dmin16(const LaneHead16& h) { return h.dmin; }
    __device__ static void decode_lane16(const uint8_t* b, int tig, int i, uint32_t (&w)[4][2]) {
        const uint32_t q = reinterpret_cast<const uint32_t*>(b + 16 + 16 * tig)[i];
#pragma unroll
        for (int s = 0; s < 4; ++s) biased_pairs(s < 3 ? q & (0x03030303u << (2 * s)) : (q >> 2) & 0x30303030u, w[s]);
    }
    // The int8 lane interface (kOptInt8Sums with kOptLanes16: staged_sub_block_int8, both phases at
    // T = 1): lane tig's units 2 tig + e (h = tig / 2, s = 2 (tig % 2) + e: the 32-value x groups
    // 2 tig + e of the chunk) as u8 sc * q with each 16-value sub-block's scale folded into the
    // integers (sc q <= 45, 4 sc q <= 180: no byte carries into the next under one IMAD), so the
    // block's d goes on the int32 sum once and no scale is applied per sub-block in float32. The
    // lane's 4 scale and min bytes are scale word tig (byte 2 e + t: unit 2 tig + e, values 16 t ..),
    // its quants the 8 qs words of half h, shifted down by 4 (tig % 2) once per word, so that unit
    // e = 0's bits are 0, 1 (q) and e = 1's 2, 3 (4 q: d / 4 in its scale). The mins go to a second
    // IMMA chain against the same x (lane_mins_int8: each sub-block's m in all 4 bytes of its A words),
    // whose int32 sum per unit is sum m (254 hi + lo) over the unit: dmin times it is the unit's
    // min term, exact in the integers (no sums of x per 16 values needed from quantize_int8).
    static constexpr bool kInt8Sums = true, kInt8SumsDown = true, kInt8Mins16 = true;
    // by default where a phase has many items (int8_for): deepseek-v3 0.40 -> 0.46 of the ceiling at
    // T = 1, qwen3-30b-a3b 2% slower (docs/BENCHMARKS.md "Q2")
    static constexpr bool kInt8Default = true, kInt8DefaultManyItems = true;
    struct LaneHeadInt8 {
        float d, dmin;
        uint32_t mn;  // unit 2 tig + e's sub-block t's min in byte 2 e + t
    };
    __device__ static LaneHeadInt8 lane_head(const uint8_t* b, int tig) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(b);  // the block starts on 4 bytes (84)
        return {half_bits(w[20]), half_bits(w[20] >> 16), (w[tig] >> 4) & 0x0F0F0F0Fu};
    }
    __device__ static void lane_scale_min(const LaneHeadInt8& h, int e, float& s, float& m) {
        s = e ? 0.25f * h.d : h.d;  // (unit e = 1 decoded as 4 sc q)
        m = h.dmin;
    }
    __device__ static void lane_mins_int8(const LaneHeadInt8& h, uint32_t (&m)[2][2]) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int t = 0; t < 2; ++t) m[e][t] = prmt(h.mn, 0u, 0x1111u * uint32_t(2 * e + t));
    }
    __device__ static void decode_lane_int8(const uint8_t* b, int tig, uint32_t (&a)[2][8]) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(b);
        const uint32_t sc = w[tig] & 0x0F0F0F0Fu;
        const uint32_t* q = w + 4 + 8 * (tig >> 1);
        const uint32_t sh = 4u * uint32_t(tig & 1);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const uint32_t k0 = prmt(sc, 0u, 0x4440u + uint32_t(t)), k1 = prmt(sc, 0u, 0x4442u + uint32_t(t));
#pragma unroll
            for (int i = 4 * t; i < 4 * t + 4; ++i) {
                const uint32_t v = q[i] >> sh;
                a[0][i] = (v & 0x03030303u) * k0;
                a[1][i] = (v & 0x0C0C0C0Cu) * k1;
            }
        }
    }
};
template <>
struct Fast<Q2_K> : Q2KFast<kMinShift> {};

// hmask[32] | qs[64] | scales[12] (16 6-bit scales, offset 32) | d:f16; 110-byte blocks, 2-byte
// aligned. Unit u = 4h + s of its block: bits 2s, 2s + 1 of qs[32h + l], minus 4 where bit 4h + s
// of hmask[l] is clear; scales i = 8h + 2s, i + 1: low 4 bits from the nibble h of bytes 2s, 2s + 1,
// high 2 bits from bits 2(2h + s/2) of bytes 8 + 2(s%2), 8 + 2(s%2) + 1.
template <>
struct Fast<Q3_K> {
    static constexpr bool kHas = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.17x of the ceiling; loaded 0.06x
    static constexpr bool kStaged = true;    // H200: 0.17x at T=1, 0.17x / 0.14x at T=8; 0.20x with ld.shared
    // (0.23x, 4 stages, in the run where float32 sub-block sums, SubBlockRows, measured 0.35x;
    // with the scales in the mma, decode_scaled: 0.38x / 0.31x against 0.36x / 0.31x in one run;
    // with wide lanes, decode_wide: 0.39x / 0.32x against 0.37x / 0.30x in one run; with the staged
    // kernel's whole-block copies and the aligned body, by default (FTW_CUDA_STAGED_WHOLECOPY=0 and
    // FTW_GGUF_CUDA_ALIGNED=0 run without them): 0.42x / 0.32x against 0.39x / 0.32x)
    struct Raw {
        Span<32, 2> hm, qs;
        uint32_t lo, hi, d;  // the words holding the scales' low bytes, high bytes, and d
        uint32_t os;         // block address % 8 | unit % 8 << 4 | byte positions of lo, hi, d << 8, 10, 12
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 110;
        const int h = (u >> 2) & 1, s = u & 3;
        const uint8_t *lo = b + 96 + 2 * s, *hi = b + 104 + 2 * (s & 1), *d = b + 108;
        const uint32_t os = span_offset<M>(b) | uint32_t(u & 7) << 4 | addr_low(lo, 3) << 8 | addr_low(hi, 3) << 10 |
                            addr_low(d, 3) << 12;
        return {load_span<32, 2, M>(b), load_span<32, 2, M>(b + 32 + 32 * h), ld_word_at<M>(lo), ld_word_at<M>(hi),
                ld_word_at<M>(d), os};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t o = raw.os & 7, j = (raw.os >> 4) & 7, h = j >> 2, s = j & 3;
        uint32_t hw[10], qw[10], hm[8], qs[8];
        span_words(raw.hm, hw);
        span_words(raw.qs, qw);
        bytes_at<8, 6, true>(hw, o, hm);
        bytes_at<8, 6, true>(qw, o, qs);
        const uint32_t low = raw.lo >> (8 * ((raw.os >> 8) & 3)), high = raw.hi >> (8 * ((raw.os >> 10) & 3));
        const float d = half_bits(raw.d >> (8 * ((raw.os >> 12) & 3)));
        const int rot = int(2 - j) & 31;  // bit 4h + s of an hmask byte -> bit 2
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t l4 = (low >> (8 * half + 4 * h)) & 15, h2 = (high >> (8 * half + 2 * (2 * h + (s >> 1)))) & 3;
            const Scaled f(d * float(int(l4 | h2 << 4) - 32));
#pragma unroll
            for (int k = 4 * half; k < 4 * half + 4; ++k) {
                const uint32_t x = ((qs[k] >> (2 * s)) & 0x03030303u) | (__funnelshift_l(hm[k], hm[k], rot) & 0x04040404u);
                int_pairs(x, bf16x2_biased(4), f, w + 2 * k);
            }
        }
    }
    // the staged kernel's sub-block interface (16-value sub-blocks, q - 4): for units 2 c2 + e
    // (h = c2 / 2, s = 2 (c2 % 2) + e) bits 2s, 2s + 1 of the qs words at 32 + 32h + 4 tig (+ 16)
    // and bit 4h + s of the hmask words at 4 tig (+ 16) to bit 2; the sixteen 6-bit scales cut a
    // byte each as ggml does (scales 4g .. 4g + 3 in sc[g]), scale = d * (sc - 32)
    static constexpr bool kSubBlocks = true;
    static constexpr int kSubBlockValues = 16;
    static constexpr bool kSubBlockMins = false;
    struct Head {
        float d, d160;  // d, -160 d
        uint32_t sc[4];
    };
    template <class R = Ring2>  // (Ring4: a block on a 4-byte boundary)
    __device__ static Head head(const uint8_t* b) {
        const R r(b);
        const uint32_t a0 = r.word(96), a1 = r.word(100), a2 = r.word(104);
        Head h;
        h.d = r.half(108), h.d160 = -160.f * h.d;
        h.sc[0] = (a0 & 0x0F0F0F0Fu) | ((a2 << 4) & 0x30303030u);
        h.sc[1] = (a1 & 0x0F0F0F0Fu) | ((a2 << 2) & 0x30303030u);
        h.sc[2] = ((a0 >> 4) & 0x0F0F0F0Fu) | (a2 & 0x30303030u);
        h.sc[3] = ((a1 >> 4) & 0x0F0F0F0Fu) | ((a2 >> 2) & 0x30303030u);
        return h;
    }
    // fma(d, 128 + sc, -160 d): d * (sc - 32) rounded once (exact: an f16 times 6 bits)
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) {
        s = fmaf(h.d, biased_byte(h.sc[j >> 2], j & 3), h.d160);
        n = 0.f;
    }
    __device__ static float head_d(const Head& h) { return h.d; }
    // The scales in the mma (kScaledInts, SubBlockRows with FTW_GGUF_CUDA_CHUNK_D, the default): each
    // pair is the exact integer (q - 4) * (sc - 32) (|.| <= 128, exact in bf16), made by one bf16
    // fma from the pair 8 + q (the quant bits at byte bits 4..6 under the exponent of bf16 8:
    // 8 + b / 16) as fma(8 + q, T, -12 T), T = sc - 32 (the product exact in the fma, -12 T exact
    // in bf16); the sub-block's T and -12 T pairs from its scale byte (one prmt, a sub and an fma).
    // So the 16 sub-blocks' mma chain on, and d scales the chunk's sums once per row: no float32
    // instruction per sub-block, where sub_scale's way takes a scale and 4 fma per sub-block and
    // row pair, for the same count of bf16 instructions per pair (an fma for the sub).
    __device__ static void decode_scaled(const uint8_t* b, const Head& hd, int c2, int tig, uint32_t (&w)[2][4]) {
        const Ring2 r(b);
        const int h = c2 >> 1;
        const uint32_t hm[2] = {r.word(4 * tig), r.word(16 + 4 * tig)};
        const uint32_t qs[2] = {r.word(32 + 32 * h + 4 * tig), r.word(48 + 32 * h + 4 * tig)};
        constexpr uint32_t k160 = bf16x2_biased(32), kM12 = 0xC140C140u, k1920 = 0x44F044F0u;  // 160, -12, 1920
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * (2 * c2 + e) + t;  // the sub-block: byte j % 4 of sc[j / 4]
                const uint32_t B = prmt(hd.sc[j >> 2], 0x43u, 0x4040u | uint32_t(j & 3) * 0x101u);  // (128 + sc) x 2
                const uint32_t T = bsub2(B, k160), C = bfma2(B, kM12, k1920);            // sc - 32, -12 (sc - 32)
                const uint32_t x = (shift_by(qs[t], 4 - 2 * s) & 0x30303030u) | (shift_by(hm[t], 6 - (4 * h + s)) & 0x40404040u);
                w[e][2 * t] = bfma2(prmt(x, 0x41u, 0x4140u), T, C);
                w[e][2 * t + 1] = bfma2(prmt(x, 0x41u, 0x4342u), T, C);
            }
        }
    }
    // The staged kernel's wide lanes (kWideLanes; SubBlockRows with d once per chunk, unless
    // FTW_GGUF_CUDA_WIDE=0): lane tig decodes values 8 tig .. 8 tig + 7 of unit 2 c2 + e, all in
    // sub-block 4 c2 + 2 e + tig / 2: one scale per unit and lane (its byte picked by a selector made
    // once; T and -12 T by a sub and an fma: half of decode_scaled's per value), the values as in
    // decode_scaled from the adjacent hmask words at 8 tig and qs words at 32 + 32h + 8 tig (three
    // aligned words for two in the ring; with R = Ring4, for a block on a 4-byte boundary, the two).
    // kAlignedBody: head and decode_wide read through Ring4 where the kernel knows the block aligned
    // (SubBlockRows' Aligned: at the deepseek-v3 size every other chunk of every row)
    static constexpr bool kAlignedBody = true;
    __device__ static void decode_wide(const uint8_t* b, const Head& hd, int c2, int tig, uint32_t (&w)[2][4]) {
        decode_wide_in<Ring2>(b, hd, c2, tig, w);
    }
    template <class R>
    __device__ static void decode_wide_in(const uint8_t* b, const Head& hd, int c2, int tig, uint32_t (&w)[2][4]) {
        const R r(b);
        const int h = c2 >> 1;
        const uint32_t hm[2] = {r.word(8 * tig), r.word(8 * tig + 4)};
        const uint32_t qs[2] = {r.word(32 + 32 * h + 8 * tig), r.word(36 + 32 * h + 8 * tig)};
        const uint32_t sel = 0x4040u | uint32_t(tig >> 1) * 0x101u;  // the lane's byte of a pair of sub-blocks, twice
        constexpr uint32_t k160 = bf16x2_biased(32), kM12 = 0xC140C140u, k1920 = 0x44F044F0u;  // 160, -12, 1920
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
            const uint32_t B = prmt(hd.sc[c2], 0x43u, sel + 0x202u * uint32_t(e));  // (128 + sc) x 2
            const uint32_t T = bsub2(B, k160), C = bfma2(B, kM12, k1920);         // sc - 32, -12 (sc - 32)
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint32_t x = (shift_by(qs[t], 4 - 2 * s) & 0x30303030u) | (shift_by(hm[t], 6 - (4 * h + s)) & 0x40404040u);
                w[e][2 * t] = bfma2(prmt(x, 0x41u, 0x4140u), T, C);
                w[e][2 * t + 1] = bfma2(prmt(x, 0x41u, 0x4342u), T, C);
            }
        }
    }
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][4]) {
        const Ring2 r(b);
        const int h = c2 >> 1;
        const uint32_t hm[2] = {r.word(4 * tig), r.word(16 + 4 * tig)};
        const uint32_t qs[2] = {r.word(32 + 32 * h + 4 * tig), r.word(48 + 32 * h + 4 * tig)};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * (c2 & 1) + e;
#pragma unroll
            for (int t = 0; t < 2; ++t)
                signed_pairs(((qs[t] >> (2 * s)) & 0x03030303u) | (shift_by(hm[t], 2 - (4 * h + s)) & 0x04040404u),
                             bf16x2_biased(4), w[e] + 2 * t);
        }
    }
};

// The signs of s's bits 0..7 (bit j set: value j negative; bits above 7 clear) onto the pairs
// w[0..3], flipped after the scaling as ggml's exact * -1.f
__device__ __forceinline__ void sign_values8(uint32_t s, uint32_t* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i)  // two copies of s, bit 2i at bit 15 and bit 2i + 1 at bit 31 (no carries)
        w[i] ^= (s * ((1u << (15 - 2 * i)) | (1u << (30 - 2 * i)))) & 0x80008000u;
}

// 8 grid magnitudes (bytes of g, < 128) times db in bf16 (one rounding), signed by `signs`
// (sign_values8); pairs into w[0..3]
__device__ __forceinline__ void grid_values8(uint2 g, uint32_t signs, float db, uint32_t* w) {
    const Scaled f(db);
    const uint32_t s = signs & 0xFFu;
    int_pairs(g.x, bf16x2_biased(0), f, w);
    int_pairs(g.y, bf16x2_biased(0), f, w + 2);
    sign_values8(s, w);
}

// ---- the IQ grids in shared memory (the staged kernel's TableLoads) ----------------------------
//
// Read from global memory through the L1, a warp's grid lookups (32 random rows of a 1-4 KB
// table) touch up to 16-32 distinct lines per load, and each lookup's 64-bit address costs an add
// with carry. In the staged kernel each block copies the grids and ksigns (generated from the
// gguf package, ggml_tables.h) into shared memory once (block_setup, before the block's
// routing, whose barriers order the copies before any decode), and decode_tables() reads them
// with 32-bit shared addresses: ksigns' 128 bytes are 32 words, one per bank; a grid row is one
// 8-byte (IQ2) or 4-byte (IQ3) word.
__shared__ __align__(16) uint2 s_iq2xxs_grid[256];
__shared__ __align__(16) uint2 s_iq2xs_grid[512];
__shared__ __align__(16) uint32_t s_iq3xxs_grid[256];
__shared__ __align__(16) uint32_t s_iq3s_grid[512];
__shared__ __align__(16) uint8_t s_ksigns[128];
// The IQ3 grids for the staged kernel's int8 units (kOptInt8; Fast<T>::kInt8Tables): a row's 4
// magnitudes plus the grid's bias B (gen_tables.py's *_grid_i8: 64 for IQ3_XXS, 16 for IQ3_S), one
// u8 word per row, copied into shared memory per block by cp.async (Int8TableRows)
__shared__ __align__(16) uint32_t s_iq3xxs_grid_i8[256];
__shared__ __align__(16) uint32_t s_iq3s_grid_i8[512];

// 0xFF in byte i where bit 7 of byte i of t is set, else 0 (prmt's sign mode: selector nibbles 8 + i)
__device__ __forceinline__ uint32_t byte_signs(uint32_t t) { return prmt(t, 0u, 0xBA98u); }
// 0xFF in byte i where bit i of x (< 128) is set: x (2^7 + 2^14 + 2^21 + 2^28) puts bit i at 8 i + 7,
// and no two of its shifted bits meet (bit j of copy c at j + 7 + 7 c, j < 7: no carry; bits 4..6
// land on no byte's bit 7)
__device__ __forceinline__ uint32_t sign_mask4(uint32_t x) { return byte_signs(x * 0x10204080u); }
// as sign_mask4 for bits 4..7 of x: (x & 0xF0) (2^3 + 2^10 + 2^17 + 2^24)
__device__ __forceinline__ uint32_t sign_mask4_hi(uint32_t x) { return byte_signs((x & 0xF0u) * 0x01020408u); }
// as sign_mask4_hi for x < 128 without the mask (bit j of copy c at j + 3 + 7 c: none meet, bits
// 0..3 on no byte's bit 7, bit 31 clear), bit 7 coming from `top` (bit 31 at most: IQ3_XXS's parity)
__device__ __forceinline__ uint32_t sign_mask4_hi7(uint32_t x, uint32_t top) { return byte_signs(x * 0x01020408u + top); }
// byte k of w (a grid index) by one prmt, which the table's address then scales by one IMAD (a shift
// and a mask took two)
__device__ __forceinline__ uint32_t grid_byte(uint32_t w, int k) { return prmt(w, 0u, 0x4440u | uint32_t(k)); }
// A grid row's int8 A word: P's bytes are B + v (v the magnitudes, 0 < v < B), m's 0xFF where the
// value is negative; those bytes take 2 B - P = B - v, the others P, so every byte is B plus the
// signed value (u8; the kernel takes B times x's group sum off, kInt8Offset). No borrow: P < 2 B.
template <int B>
__device__ __forceinline__ uint32_t grid_signed_u8(uint32_t P, uint32_t m) {
    static_assert(B > 0 && 2 * B < 256, "a bias of one byte");
    const uint32_t n = uint32_t(2 * B) * 0x01010101u - P;
    return (P & ~m) | (n & m);
}

// a table of N words of type W from the generated global one, by the block's threads: loaded and
// stored, or (Async) 16 bytes per cp.async, which the kernel waits for after its routing
template <bool Async, class W, int N>
__device__ __forceinline__ void copy_table(W (&dst)[N], const void* src) {
    static_assert(sizeof(W) * N % 16 == 0 && sizeof(W) * N <= 8192, "a grid table");
    if constexpr (Async) {
        const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
        for (int i = threadIdx.x; i < int(sizeof(W)) * N / 16; i += blockDim.x)
            cp_async16(d + 16 * i, reinterpret_cast<const uint4*>(src) + i, 16);
    } else {
        const W* s = reinterpret_cast<const W*>(src);
        for (int i = threadIdx.x; i < N; i += blockDim.x) dst[i] = s[i];
    }
}

// A grid's value q times the sub-block's scale s rounded to bf16 (h), in one fma per pair: the
// magic pair (128 + q0, 128 + q1) times h plus -128 h (exact: h times a power of two) is q h
// rounded once, the same bits as int_pairs' subtraction and multiply (two instructions).
struct GridScale {
    uint32_t d, c;
    __device__ explicit GridScale(float s) {
        const float h = __bfloat162float(__float2bfloat16_rn(s));
        d = bf16x2_of(h);
        c = bf16x2_of(-128.0f * h);
    }
};

// grid_values8 with GridScale: 8 magnitudes (bytes of g, < 128) signed by bits 0..7 of signs
__device__ __forceinline__ void grid_values8_fma(uint2 g, uint32_t signs, const GridScale& f, uint32_t* w) {
    const uint32_t s = signs & 0xFFu;
    w[0] = bfma2(prmt(g.x, 0x43u, 0x4140u), f.d, f.c);
    w[1] = bfma2(prmt(g.x, 0x43u, 0x4342u), f.d, f.c);
    w[2] = bfma2(prmt(g.y, 0x43u, 0x4140u), f.d, f.c);
    w[3] = bfma2(prmt(g.y, 0x43u, 0x4342u), f.d, f.c);
    sign_values8(s, w);
}

// The staged kernel's ring loads (SharedLoads or SharedLoadsGeneric) for a type whose Fast<T>
// decodes with tables (decode_tables): StagedRows then decodes that way, after the block has
// filled the tables it keeps in shared memory (Fast<T>::fill_tables, as block_setup; Async: by
// cp.async, waited for after the block's routing).
template <class Base, bool Async = false>
struct TableLoads : Base {
    static constexpr bool kTables = true, kAsync = Async;
};
FTW_OPTIONAL_MEMBER(LoadsTables, kTables, bool, false);
FTW_HAS_MEMBER(HasTables, decode_tables);
template <class D, class = void>  // Fast<T>::fill_tables<Async>(): tables in shared memory
struct HasFill : std::false_type {};
template <class D>
struct HasFill<D, std::void_t<decltype(&D::template fill_tables<false>)>> : std::true_type {};

// IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S: 2-byte aligned blocks, d:f16 first, then the sub-block's 8
// bytes of grid indices at 2 + 8 * sub-block
struct IqHead {
    Span<8, 2> qs;
    uint32_t d;   // the word holding d
    uint32_t os;  // address % 8 of the qs bytes | d's byte position << 4 | more per type
};
template <class M>
__device__ __forceinline__ IqHead iq_head(const uint8_t* b, int ib) {
    return {load_span<8, 2, M>(b + 2 + 8 * ib), ld_word_at<M>(b), span_offset<M>(b + 2) | addr_low(b, 3) << 4};
}
__device__ __forceinline__ float iq_d(const IqHead& r) { return half_bits(r.d >> (8 * ((r.os >> 4) & 3))); }
__device__ __forceinline__ void iq_qs(const IqHead& r, uint32_t (&q)[2]) {
    uint32_t v[4];
    span_words(r.qs, v);
    bytes_at<2, 6, true>(v, r.os & 7, q);
}

// d | per sub-block: u32 of 4 grid indices, u32 of 4x7 sign bits + 4-bit scale; 66-byte blocks
template <>
struct Fast<IQ2_XXS> {
    static constexpr bool kHas = true;
    // staged with its grids in shared memory, copied by cp.async (decode_tables): H200, T=1,
    // deepseek-v3 0.15x -> 0.17x, qwen3-30b-a3b 0.16x -> 0.16x (1.03x faster) of the ceiling, same run
    static constexpr bool kTables = true;
    static constexpr bool kStaged = true;  // H200, T=1: 0.16x of the ceiling; loaded 0.15x, prefetched 0.12x
    static constexpr bool kGenericShared = true;  // as IQ3_S (SharedLoads)
    using Raw = IqHead;
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) { return iq_head<M>(row + int64_t(u >> 3) * 66, u & 7); }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t a[2];
        iq_qs(raw, a);
        const float db = __fmul_rn(__fmul_rn(iq_d(raw), 0.5f + float(a[1] >> 28)), 0.25f);
#pragma unroll
        for (int l = 0; l < 4; ++l)
            grid_values8(__ldg(reinterpret_cast<const uint2*>(tb::iq2xxs_grid[(a[0] >> (8 * l)) & 255])),
                         __ldg(&tb::ksigns[(a[1] >> (7 * l)) & 127]), db, w + 4 * l);
    }
    template <bool Async>
    __device__ static void fill_tables() {
        copy_table<Async>(s_iq2xxs_grid, tb::iq2xxs_grid);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
    // decode() with the grid and ksigns in shared memory (the staged kernel's TableLoads): same values
    __device__ static void decode_tables(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t a[2];
        iq_qs(raw, a);
        const GridScale f(__fmul_rn(__fmul_rn(iq_d(raw), 0.5f + float(a[1] >> 28)), 0.25f));
#pragma unroll
        for (int l = 0; l < 4; ++l)
            grid_values8_fma(s_iq2xxs_grid[(a[0] >> (8 * l)) & 255], s_ksigns[(a[1] >> (7 * l)) & 127], f, w + 4 * l);
    }
};

// d | qs:u16[32] (9-bit grid index, 7-bit sign index) | scales[8] (a nibble per 16 values); 74 bytes
template <>
struct Fast<IQ2_XS> {
    static constexpr bool kHas = true;
    // staged with its grids in shared memory, copied by cp.async (decode_tables): H200, T=1,
    // deepseek-v3 0.16x -> 0.18x, qwen3-30b-a3b 0.16x -> 0.17x of the ceiling, same run
    static constexpr bool kTables = true;
    static constexpr bool kStaged = true;  // H200, T=1: 0.16x of the ceiling; loaded 0.15x, prefetched 0.14x
    static constexpr bool kGenericShared = true;  // as IQ3_S (SharedLoads)
    struct Raw {
        IqHead head;
        uint32_t sc;  // the word holding the sub-block's scale byte (position in head.os bits 8..9)
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 74;
        const int ib = u & 7;
        IqHead h = iq_head<M>(b, ib);
        h.os |= addr_low(b + 66 + ib, 3) << 8;
        return {h, ld_word_at<M>(b + 66 + ib)};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[2];
        iq_qs(raw.head, q);
        const float d = iq_d(raw.head);
        const uint32_t sc = raw.sc >> (8 * ((raw.head.os >> 8) & 3));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t e = (q[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
            const float db = __fmul_rn(__fmul_rn(d, 0.5f + float((sc >> (4 * (k >> 1))) & 15)), 0.25f);
            grid_values8(__ldg(reinterpret_cast<const uint2*>(tb::iq2xs_grid[e & 511])), __ldg(&tb::ksigns[e >> 9]), db,
                         w + 4 * k);
        }
    }
    template <bool Async>
    __device__ static void fill_tables() {
        copy_table<Async>(s_iq2xs_grid, tb::iq2xs_grid);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
    __device__ static void decode_tables(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[2];
        iq_qs(raw.head, q);
        const float d = iq_d(raw.head);
        const uint32_t sc = raw.sc >> (8 * ((raw.head.os >> 8) & 3));
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // a scale per 16 values
            const GridScale f(__fmul_rn(__fmul_rn(d, 0.5f + float((sc >> (4 * h)) & 15)), 0.25f));
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint32_t e = (q[h] >> (16 * t)) & 0xFFFFu;
                grid_values8_fma(s_iq2xs_grid[e & 511], s_ksigns[e >> 9], f, w + 8 * h + 4 * t);
            }
        }
    }
};

// d | qs[64] (grid index per 4 values) | per sub-block: u32 of 4x7 sign bits + scale; 98 bytes
template <>
struct Fast<IQ3_XXS> {
    static constexpr bool kHas = true;
    // register-fed: H200, T=1, 0.24x of the ceiling; staged 0.19x (at T = 1 in phases of many items:
    // int8 units, decode_int8 below)
    static constexpr bool kGenericShared = true;  // as IQ3_S (where staged: FTW_GGUF_CUDA_DECODER=staged)
    struct Raw {
        IqHead head;
        uint32_t s0, s1;  // the words covering the sub-block's u32 of signs and scale (2-byte aligned)
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 98;
        const int ib = u & 7;
        const uint8_t* a = b + 66 + 4 * ib;
        IqHead h = iq_head<M>(b, ib);
        h.os |= addr_low(a, 3) << 8;
        const uint32_t* w = M::template align<4, uint32_t>(a);
        // the next word only where the 4 bytes straddle two (a % 4 == 2): the word after the last
        // sub-block's lies past the block, past the bank for its last block
        return {h, M::word(w), M::word(w + (addr_low(a, 3) >> 1))};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t s = __funnelshift_r(raw.s0, raw.s1, 8 * ((raw.head.os >> 8) & 3));
        const float db = __fmul_rn(__fmul_rn(iq_d(raw.head), 0.5f + float(s >> 28)), 0.5f);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i0 = (q[l >> 1] >> (16 * (l & 1))) & 0xFFu, i1 = (q[l >> 1] >> (16 * (l & 1) + 8)) & 0xFFu;
            const uint2 g = {__ldg(reinterpret_cast<const uint32_t*>(tb::iq3xxs_grid[i0])),
                             __ldg(reinterpret_cast<const uint32_t*>(tb::iq3xxs_grid[i1]))};
            grid_values8(g, __ldg(&tb::ksigns[(s >> (7 * l)) & 127]), db, w + 4 * l);
        }
    }
    template <bool Async>
    __device__ static void fill_tables() {
        copy_table<Async>(s_iq3xxs_grid, tb::iq3xxs_grid);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
    __device__ static void decode_tables(const Raw& raw, uint32_t (&w)[16]) {
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t s = __funnelshift_r(raw.s0, raw.s1, 8 * ((raw.head.os >> 8) & 3));
        const GridScale f(__fmul_rn(__fmul_rn(iq_d(raw.head), 0.5f + float(s >> 28)), 0.5f));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i0 = (q[l >> 1] >> (16 * (l & 1))) & 0xFFu, i1 = (q[l >> 1] >> (16 * (l & 1) + 8)) & 0xFFu;
            grid_values8_fma(make_uint2(s_iq3xxs_grid[i0], s_iq3xxs_grid[i1]), s_ksigns[(s >> (7 * l)) & 127], f, w + 4 * l);
        }
    }
    // The staged kernel's int8 unit at T = 1 (kOptInt8, from its shared-memory table: kInt8Tables,
    // Int8TableRows): grid row r (values 4 r .. 4 r + 3, x in its natural order) as 64 + the signed
    // values (grid_signed_u8) into a[2 r] (r < 4) or a[2 (r - 4) + 1]; the signs of rows 2 l, 2 l + 1
    // are ksigns[e] for the 7 bits e of group l, whose bit 7 is e's parity (popc), so no table;
    // db = d (0.5 + scale) 0.5 on the integer sums, rounded as decode's. By default in a phase of many
    // items (int8_for: staged_for_items), as measured on the H200 (docs/BENCHMARKS.md "IQ3 int8"; T = 1,
    // both phases against the default before, same run): deepseek-v3 112.8 -> 105.5 us (0.30 -> 0.32
    // of the ceiling); qwen3-30b-a3b slower, 22.5 -> 25.3 (its register-fed decode stays)
    static constexpr bool kInt8 = true, kInt8Tables = true, kInt8Default = true;
    static constexpr int kInt8Offset = tb::iq3xxs_grid_i8_bias;
    template <bool Async>
    __device__ static void fill_int8_tables() {
        copy_table<Async>(s_iq3xxs_grid_i8, tb::iq3xxs_grid_i8);
    }
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t s = __funnelshift_r(raw.s0, raw.s1, 8 * ((raw.head.os >> 8) & 3));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t e = (s >> (7 * l)) & 127u;
            const uint32_t m[2] = {sign_mask4(e), sign_mask4_hi7(e, __popc(e) << 31)};
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int r = 2 * l + t;
                const uint32_t P = s_iq3xxs_grid_i8[grid_byte(q[r >> 2], r & 3)];
                a[r < 4 ? 2 * r : 2 * (r - 4) + 1] = grid_signed_u8<kInt8Offset>(P, m[t]);
            }
        }
        return __fmul_rn(__fmul_rn(iq_d(raw.head), 0.5f + float(s >> 28)), 0.5f);
    }
};

// d | qs[64] | qh[8] (9th index bit) | signs[32] (a bit per value) | scales[4] (nibbles); 110 bytes
template <>
struct Fast<IQ3_S> {
    static constexpr bool kHas = true;
    // staged with its grids in shared memory, copied by cp.async (decode_tables): H200, T=1,
    // deepseek-v3 0.20x -> 0.22x, qwen3-30b-a3b 0.18x -> 0.19x of the ceiling, same run
    static constexpr bool kTables = true;
    static constexpr bool kPrefetch = true;  // H200, T=1: 0.18x of the ceiling; loaded 0.17x
    static constexpr bool kStaged = true;    // H200: 0.19x, faster than both
    static constexpr bool kGenericShared = true;  // H200: 0.20x; 0.19x with ld.shared (SharedLoads)
    struct Raw {
        IqHead head;
        uint32_t qh, sg0, sg1, sc;  // words holding qh[ib], the 4 sign bytes (2-byte aligned), the scale byte
    };
    template <class M = GlobalLoads>
    __device__ static Raw load(const uint8_t* row, int u) {
        const uint8_t* b = row + int64_t(u >> 3) * 110;
        const int ib = u & 7;
        const uint8_t *qh = b + 66 + ib, *sg = b + 74 + 4 * ib, *sc = b + 106 + ib / 2;
        IqHead h = iq_head<M>(b, ib);
        h.os |= addr_low(qh, 3) << 8 | addr_low(sg, 3) << 10 | addr_low(sc, 3) << 12 | uint32_t(ib & 1) << 14;
        const uint32_t* sw = M::template align<4, uint32_t>(sg);
        return {h, ld_word_at<M>(qh), M::word(sw), M::word(sw + 1), ld_word_at<M>(sc)};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t os = raw.head.os;
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t qh = raw.qh >> (8 * ((os >> 8) & 3));
        const uint32_t sg = __funnelshift_r(raw.sg0, raw.sg1, 8 * ((os >> 10) & 3));
        const uint32_t sc = (raw.sc >> (8 * ((os >> 12) & 3) + 4 * ((os >> 14) & 1))) & 15;
        const float db = iq_d(raw.head) * float(1 + 2 * int(sc));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            uint32_t idx[2];
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int k = 2 * l + t;
                idx[t] = ((q[k >> 2] >> (8 * (k & 3))) & 0xFFu) | ((qh >> k) & 1) << 8;
            }
            const uint2 g = {__ldg(reinterpret_cast<const uint32_t*>(tb::iq3s_grid[idx[0]])),
                             __ldg(reinterpret_cast<const uint32_t*>(tb::iq3s_grid[idx[1]]))};
            grid_values8(g, sg >> (8 * l), db, w + 4 * l);
        }
    }
    template <bool Async>
    __device__ static void fill_tables() {
        copy_table<Async>(s_iq3s_grid, tb::iq3s_grid);
    }
    __device__ static void decode_tables(const Raw& raw, uint32_t (&w)[16]) {
        const uint32_t os = raw.head.os;
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t qh = raw.qh >> (8 * ((os >> 8) & 3));
        const uint32_t sg = __funnelshift_r(raw.sg0, raw.sg1, 8 * ((os >> 10) & 3));
        const uint32_t sc = (raw.sc >> (8 * ((os >> 12) & 3) + 4 * ((os >> 14) & 1))) & 15;
        const GridScale f(iq_d(raw.head) * float(1 + 2 * int(sc)));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            uint32_t idx[2];
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int k = 2 * l + t;
                idx[t] = ((q[k >> 2] >> (8 * (k & 3))) & 0xFFu) | ((qh >> k) & 1) << 8;
            }
            grid_values8_fma(make_uint2(s_iq3s_grid[idx[0]], s_iq3s_grid[idx[1]]), sg >> (8 * l), f, w + 4 * l);
        }
    }
    // The staged kernel's int8 unit at T = 1 (kOptInt8, from its shared-memory table: kInt8Tables,
    // Int8TableRows): grid row r (9-bit index, values 4 r .. 4 r + 3) as 16 + the signed values
    // (grid_signed_u8, the signs bits 4 r .. 4 r + 3 of the unit's sign word) into a[2 r] (r < 4) or
    // a[2 (r - 4) + 1]; db = d (1 + 2 scale) on the integer sums, as decode's. By default in down only
    // (kInt8DefaultDown), as measured on the H200 (docs/BENCHMARKS.md "IQ3 int8"; T = 1, one run):
    // down only deepseek-v3 118.8 -> 116.9 us, qwen3-30b-a3b 28.5 -> 28.0; both phases 120.0 and 28.2
    static constexpr bool kInt8 = true, kInt8Tables = true, kInt8Default = false, kInt8DefaultDown = true;
    static constexpr int kInt8Offset = tb::iq3s_grid_i8_bias;
    template <bool Async>
    __device__ static void fill_int8_tables() {
        copy_table<Async>(s_iq3s_grid_i8, tb::iq3s_grid_i8);
    }
    __device__ static float decode_int8(const Raw& raw, uint32_t (&a)[8]) {
        const uint32_t os = raw.head.os;
        uint32_t q[2];
        iq_qs(raw.head, q);
        const uint32_t qh = raw.qh >> (8 * ((os >> 8) & 3));
        const uint32_t sg = __funnelshift_r(raw.sg0, raw.sg1, 8 * ((os >> 10) & 3));
        const uint32_t sc = (raw.sc >> (8 * ((os >> 12) & 3) + 4 * ((os >> 14) & 1))) & 15;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const uint32_t idx = grid_byte(q[r >> 2], r & 3) | ((qh >> r) & 1u) << 8;
            const uint32_t sb = sg >> (8 * (r >> 1));  // the sign byte of rows r & ~1, r | 1
            const uint32_t m = r & 1 ? sign_mask4_hi(sb) : sign_mask4(sb & 15u);
            a[r < 4 ? 2 * r : 2 * (r - 4) + 1] = grid_signed_u8<kInt8Offset>(s_iq3s_grid_i8[idx], m);
        }
        return iq_d(raw.head) * float(1 + 2 * int(sc));
    }
};

// ---- IQ types on float32 sub-block sums (the staged kernel's kIntSums interface) -------------
//
// experts_decode_staged (csrc/cuda/experts_kernels.cuh, staged_int_sum_chunk) puts the grid
// values into the mma as they are, exact bf16 integers with their signs (IQ2: 8, 25, 43; IQ3_XXS
// 4..62; IQ3_S 1..15), and applies each scale group's scale to the mma's float32 sums (ggml's
// db = d * f, f = 0.5 + n or 1 + 2 n exact: f per group, d once per chunk and row): no weight is
// rounded at all, and no value is multiplied by its scale. The quad's four lanes split each
// 32-value sub-block: lane tig takes values 8 tig .. 8 tig + 7 (one IQ2 grid
// row, two IQ3 rows, one ksigns byte) where a scale covers the sub-block, and values 4 tig ..
// 4 tig + 3 of each half (half an IQ2 row) where a scale covers 16 values (IQ2_XS). The grids are
// copied as bf16 bit patterns (generated from the gguf package, *_grid_bf16: one 16-byte or 8-byte
// word per row) into shared memory per block by cp.async, with ksigns (as the tables of
// decode_tables above). IqInt<T> per type (kHas), seen by the kernel through IntSumRows below:
//   kScaleGroup                           values per scale: 32 or 16
//   float head(b)                         the block's d at b, times the type's power of two
//   int_values(b, j, tig, w[4], s[2])     the lane's 8 values of sub-block j as signed integer bf16
//                                         pairs in the order the kernel's mma take them, and the
//                                         scales of its groups in units of d (s[1] only for
//                                         16-value groups): db / d = 0.5 + n, 1 + 2 n, exact
//                                         (the kernel multiplies the chunk's sums by d once)
//   fill_int_tables<Async>()              the tables into shared memory (the block's setup)
__shared__ __align__(16) uint4 s_iq2xxs_bf16[256];
__shared__ __align__(16) uint4 s_iq2xs_bf16[512];
__shared__ __align__(16) uint2 s_iq3xxs_bf16[256];
__shared__ __align__(16) uint2 s_iq3s_bf16[512];

// 2 bytes at a 2-byte-aligned address, 4 bytes at a 2-byte-aligned address (two 16-bit loads)
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | ld_u16(p + 2) << 16; }

// n + 0.5 for an integer n < 2^22, exactly: the float 2^23 + n (its bits need no conversion) less
// 2^23 - 0.5
__device__ __forceinline__ float half_step(uint32_t n) { return __uint_as_float(0x4B000000u | n) - (kTwo23 - 0.5f); }

// T's decode on float32 sums (kHas), taken by default (kDefault) or with FTW_GGUF_CUDA_INTSUMS=1
template <class T>
struct IqInt {
    static constexpr bool kHas = false, kDefault = false;
};

// d | per sub-block: u32 of 4 grid indices, u32 of 4x7 sign bits + 4-bit scale; 66-byte blocks.
// db = d * (0.5 + scale) * 0.25 (the 0.25 on d: a power of two, the same float).
// H200, T=1, x the streaming ceiling against the decode before (decode_tables), same run
// (docs/BENCHMARKS.md, "IQ types on float32 sub-block sums"): deepseek-v3 0.17 -> 0.18,
// qwen3-30b-a3b 0.16 -> 0.17
template <>
struct IqInt<IQ2_XXS> {
    static constexpr bool kHas = true, kDefault = true;
    static constexpr int kScaleGroup = 32;
    __device__ static float head(const uint8_t* b) { return half_bits(ld_u16(b)) * 0.25f; }
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint8_t* q = b + 2 + 8 * j;
        const uint32_t a = ld_u32_a2(q + 4);
        const uint4 g = s_iq2xxs_bf16[q[tig]];
        w[0] = g.x, w[1] = g.y, w[2] = g.z, w[3] = g.w;
        sign_values8(s_ksigns[(a >> (7 * tig)) & 127], w);
        s[0] = half_step(a >> 28);
    }
    template <bool Async>
    __device__ static void fill_int_tables() {
        copy_table<Async>(s_iq2xxs_bf16, tb::iq2xxs_grid_bf16);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
};

// d | qs:u16[32] (9-bit grid index, 7-bit sign index per 8 values) | scales[8] (a nibble per 16
// values); 74 bytes. Lane tig: values 4 tig .. 4 tig + 3 of each half e, i.e. half tig & 1 of grid
// row 2 e + tig / 2.
// H200, T=1: 0.18 -> 0.19, 0.17 -> 0.18 (T=8 same experts 4-6% slower: 0.16 -> 0.15, 0.14 -> 0.14)
template <>
struct IqInt<IQ2_XS> {
    static constexpr bool kHas = true, kDefault = true;
    static constexpr int kScaleGroup = 16;
    __device__ static float head(const uint8_t* b) { return half_bits(ld_u16(b)) * 0.25f; }
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint8_t* q = b + 2 + 8 * j + 2 * (tig >> 1);
        const uint32_t sc = b[66 + j], half = tig & 1;
        // sign_values8's multipliers for the half's sign bits 4 half .. 4 half + 3
        const uint32_t m0 = half ? (1u << 11 | 1u << 26) : (1u << 15 | 1u << 30);
        const uint32_t m1 = half ? (1u << 9 | 1u << 24) : (1u << 13 | 1u << 28);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t v = ld_u16(q + 4 * e);
            const uint2 g = reinterpret_cast<const uint2*>(s_iq2xs_bf16)[2 * (v & 511) + half];
            const uint32_t sg = s_ksigns[v >> 9];
            w[2 * e] = g.x ^ ((sg * m0) & 0x80008000u);
            w[2 * e + 1] = g.y ^ ((sg * m1) & 0x80008000u);
            s[e] = half_step((sc >> (4 * e)) & 15);
        }
    }
    template <bool Async>
    __device__ static void fill_int_tables() {
        copy_table<Async>(s_iq2xs_bf16, tb::iq2xs_grid_bf16);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
};

// d | qs[64] (a grid index per 4 values) | per sub-block: u32 of 4x7 sign bits + scale; 98 bytes.
// db = d * (0.5 + scale) * 0.5
// Not the default with one grid: H200, T=1, 0.24 -> 0.24 at deepseek-v3, but 0.26 -> 0.21 at
// qwen3-30b-a3b against its register-fed decode (FTW_GGUF_CUDA_INTSUMS=1 runs it). With the grid in
// copies (IqCopies), where both phases take them (kDefaultWithCopies: rows of 8 chunks or more):
// deepseek-v3 0.24 -> 0.28 (T=8 same experts 0.20 -> 0.26); at qwen3-30b-a3b (down's rows of 3
// chunks) it stays register-fed (docs/BENCHMARKS.md, "IQ3")
template <>
struct IqInt<IQ3_XXS> {
    static constexpr bool kHas = true, kDefault = false, kDefaultWithCopies = true;
    static constexpr int kScaleGroup = 32;
    __device__ static float head(const uint8_t* b) { return half_bits(ld_u16(b)) * 0.5f; }
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint32_t i = ld_u16(b + 2 + 8 * j + 2 * tig), a = ld_u32_a2(b + 66 + 4 * j);
        const uint2 g0 = s_iq3xxs_bf16[i & 255], g1 = s_iq3xxs_bf16[i >> 8];
        w[0] = g0.x, w[1] = g0.y, w[2] = g1.x, w[3] = g1.y;
        sign_values8(s_ksigns[(a >> (7 * tig)) & 127], w);
        s[0] = half_step(a >> 28);
    }
    template <bool Async>
    __device__ static void fill_int_tables() {
        copy_table<Async>(s_iq3xxs_bf16, tb::iq3xxs_grid_bf16);
        copy_table<Async>(s_ksigns, tb::ksigns);
    }
};

// d | qs[64] | qh[8] (9th index bit) | signs[32] (a bit per value) | scales[4] (nibbles); 110 bytes.
// db = d * (1 + 2 scale)
// H200, T=1: 0.22 -> 0.28, 0.18 -> 0.22 (1.27x, 1.19x faster)
template <>
struct IqInt<IQ3_S> {
    static constexpr bool kHas = true, kDefault = true;
    static constexpr int kScaleGroup = 32;
    __device__ static float head(const uint8_t* b) { return half_bits(ld_u16(b)); }
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint32_t i = ld_u16(b + 2 + 8 * j + 2 * tig), qh = uint32_t(b[66 + j]) >> (2 * tig);
        const uint2 g0 = s_iq3s_bf16[(i & 255) | (qh & 1) << 8], g1 = s_iq3s_bf16[(i >> 8) | (qh & 2) << 7];
        w[0] = g0.x, w[1] = g0.y, w[2] = g1.x, w[3] = g1.y;
        sign_values8(b[74 + 4 * j + tig], w);
        const uint32_t sc = (uint32_t(b[106 + (j >> 1)]) >> (4 * (j & 1))) & 15;
        s[0] = __uint_as_float(0x4B000000u | (2 * sc + 1)) - kTwo23;  // 1 + 2 sc exactly
    }
    template <bool Async>
    __device__ static void fill_int_tables() {
        copy_table<Async>(s_iq3s_bf16, tb::iq3s_grid_bf16);
    }
};

// ---- the grids in copies, one per lane of a shared-memory phase (IqCopies) ------------------
//
// In the sums above a lane's grid lookup is a random row of the table, and every warp's lookup is
// served by shared memory a phase at a time: 8 lanes for 16-byte loads (IQ2_XXS: lanes 8 q ..
// 8 q + 7, rows 2 q and 2 q + 1 of the tile), 16 for 8-byte ones (IQ2_XS's half rows, IQ3). Lanes of
// a phase that read different rows in the same banks are served one after the other: for IQ2_XXS
// 10.2 wavefronts per 16-byte lookup on average where 4 is the least (random rows, simulated), and
// the lookups are the larger part of the kernel's shared-memory traffic, which with one
// wavefront per cycle per SM bounds it before the issue rate does (IQS: every IQ type took about
// the same time per step whatever its bytes). So the table is held in R copies interleaved row by
// row (row e of copy c at (e R + c) * E bytes, E the row's bytes) and each lane reads the copy of
// its place in the phase: lane & 7 (R = 8: every lane of a phase in banks of its own, 4
// wavefronts per 16-byte lookup; for 8-byte rows the two lanes of a copy in a phase collide only
// when their rows have the same parity), or for IQ2_XS (R = 4, 16-byte rows read as halves)
// (lane >> 1) & 3, the two lanes reading one row's halves sharing a copy. The copies take 16-32 KB
// per block: the launch runs them in blocks of 4 warps (kBlockWarps) and only where a phase's rows
// have at least 8 chunks (grid_copies), copied by cp.async through the L1 (the block reads its 2-8
// KB source R times), waited for once the ring's first stages are in flight (kSetupLate).
// H200 (docs/BENCHMARKS.md, "IQ3"), T=1, x the streaming ceiling, one grid -> copies, same run:
// deepseek-v3 IQ2_XXS 0.18 -> 0.23, IQ2_XS 0.19 -> 0.21, IQ3_S 0.28 -> 0.31 (IQ3_XXS on sums 0.28
// against 0.24 register-fed); qwen3-30b-a3b (gate_up only) 0.18 -> 0.19, 0.18 -> 0.19, 0.22 -> 0.22.
// ncu, IQ2_XXS gate_up at deepseek-v3: shared-memory bank conflicts 5.7 M -> 9 K, shared load
// wavefronts 13.2 M -> 6.6 M, 81.3 -> 65.7 us.
// ksigns is not read from a table either: ksigns[i] = i | parity(i) << 7, whose bit 7 is the sign
// of value 7 (bit 31 of the last pair): popc(i) << 31 added into that pair's product term
// (sign_values7p: a popc and a shift for a load and its address).
__shared__ __align__(16) uint4 s_iq2xxs_bf16_x8[256 * 8];
__shared__ __align__(16) uint4 s_iq2xs_bf16_x4[512 * 4];
__shared__ __align__(16) uint2 s_iq3xxs_bf16_x8[256 * 8];
__shared__ __align__(16) uint2 s_iq3s_bf16_x8[512 * 8];

// sign_values8(ksigns[i], w) for i < 128, without the table
__device__ __forceinline__ void sign_values7p(uint32_t i, uint32_t* w) {
    const uint32_t parity = __popc(i) << 31;
#pragma unroll
    for (int k = 0; k < 4; ++k)  // (i's bit 7 is 0: the products' bit 31 is free for the parity)
        w[k] ^= (i * ((1u << (15 - 2 * k)) | (1u << (30 - 2 * k))) + (k == 3 ? parity : 0u)) & 0x80008000u;
}

// E bytes (4, 8 or 16) by cp.async through the L1 (.ca: the source is read once per copy)
template <int E>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src) {
    static_assert(E == 4 || E == 8 || E == 16, "4, 8 or 16 bytes");
    if constexpr (E == 16)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if constexpr (E == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// R copies of a table of rows of type W (N / R rows) from the generated global one, interleaved
// row by row, by the block's threads
template <int R, class W, int N>
__device__ __forceinline__ void copy_table_copies(W (&dst)[N], const void* src) {
    static_assert(N % R == 0 && (R & (R - 1)) == 0, "R copies");
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    const W* s = reinterpret_cast<const W*>(src);
    for (int i = threadIdx.x; i < N; i += blockDim.x) cp_async_ca<sizeof(W)>(d + uint32_t(sizeof(W)) * i, s + i / R);
}

// T's sums with its grid in copies (kHas): IqInt<T>'s values, read from the copies
template <class T>
struct IqCopies {
    static constexpr bool kHas = false;
};

template <>
struct IqCopies<IQ2_XXS> {
    static constexpr bool kHas = true;
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint8_t* q = b + 2 + 8 * j;
        const uint32_t a = ld_u32_a2(q + 4);
        const uint4 g = (s_iq2xxs_bf16_x8 + (threadIdx.x & 7))[q[tig] * 8];  // the lane's copy
        w[0] = g.x, w[1] = g.y, w[2] = g.z, w[3] = g.w;
        sign_values7p((a >> (7 * tig)) & 127, w);
        s[0] = half_step(a >> 28);
    }
    template <bool>
    __device__ static void fill() { copy_table_copies<8>(s_iq2xxs_bf16_x8, tb::iq2xxs_grid_bf16); }
};

template <>
struct IqCopies<IQ2_XS> {
    static constexpr bool kHas = true;
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint8_t* q = b + 2 + 8 * j + 2 * (tig >> 1);
        const uint32_t sc = b[66 + j], half = tig & 1;
        const uint2* copy = reinterpret_cast<const uint2*>(s_iq2xs_bf16_x4 + ((threadIdx.x >> 1) & 3)) + half;
        const uint32_t m0 = half ? (1u << 11 | 1u << 26) : (1u << 15 | 1u << 30);
        const uint32_t m1 = half ? (1u << 9 | 1u << 24) : (1u << 13 | 1u << 28);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t v = ld_u16(q + 4 * e);
            const uint2 g = copy[(v & 511) * 8];
            const uint32_t sg = v >> 9;  // ksigns' bit 7 (the parity): bit 31 of half 1's last pair
            w[2 * e] = g.x ^ ((sg * m0) & 0x80008000u);
            w[2 * e + 1] = g.y ^ ((sg * m1 + (half ? __popc(sg) << 31 : 0u)) & 0x80008000u);
            s[e] = half_step((sc >> (4 * e)) & 15);
        }
    }
    template <bool>
    __device__ static void fill() { copy_table_copies<4>(s_iq2xs_bf16_x4, tb::iq2xs_grid_bf16); }
};

template <>
struct IqCopies<IQ3_XXS> {
    static constexpr bool kHas = true;
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint32_t i = ld_u16(b + 2 + 8 * j + 2 * tig), a = ld_u32_a2(b + 66 + 4 * j);
        const uint2* copy = s_iq3xxs_bf16_x8 + (threadIdx.x & 7);
        const uint2 g0 = copy[(i & 255) * 8], g1 = copy[(i >> 8) * 8];
        w[0] = g0.x, w[1] = g0.y, w[2] = g1.x, w[3] = g1.y;
        sign_values7p((a >> (7 * tig)) & 127, w);
        s[0] = half_step(a >> 28);
    }
    template <bool>
    __device__ static void fill() { copy_table_copies<8>(s_iq3xxs_bf16_x8, tb::iq3xxs_grid_bf16); }
};

template <>
struct IqCopies<IQ3_S> {
    static constexpr bool kHas = true;
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        const uint32_t i = ld_u16(b + 2 + 8 * j + 2 * tig), qh = uint32_t(b[66 + j]) >> (2 * tig);
        const uint2* copy = s_iq3s_bf16_x8 + (threadIdx.x & 7);
        const uint2 g0 = copy[((i & 255) | (qh & 1) << 8) * 8];
        const uint2 g1 = copy[((i >> 8) | (qh & 2) << 7) * 8];
        w[0] = g0.x, w[1] = g0.y, w[2] = g1.x, w[3] = g1.y;
        sign_values8(b[74 + 4 * j + tig], w);
        const uint32_t sc = (uint32_t(b[106 + (j >> 1)]) >> (4 * (j & 1))) & 15;
        s[0] = __uint_as_float(0x4B000000u | (2 * sc + 1)) - kTwo23;  // 1 + 2 sc exactly
    }
    template <bool>
    __device__ static void fill() { copy_table_copies<8>(s_iq3s_bf16_x8, tb::iq3s_grid_bf16); }
};

// ---- IQ2 grids as int8 units (the staged kernel's kOptInt8 at T = 1) --------------------------
//
// An IQ2_XXS sub-block is one of kOptInt8's units: 32 values, one scale db = d (0.5 + n) / 4, and
// values that are small integers (one of the grid's 3 levels, 8, 25 or 43, with a sign each). So a
// lane of the int8 body (experts_decode_staged's I8: lane tig decodes units tig + 4 j of rows g and
// g + 8 whole) makes each 8 values of a unit by one prmt per 4: the grid row as 8 level codes, a
// nibble each (*_grid_codes), or'd with the sign index's 8 signs at bit 2 of each nibble
// (ksigns_nibbles, the parity included), is the selector of 4 values' bytes from the 8 bytes
// +levels, -levels (generated: *_grid_u8_word*, 128 + value; *_s8_word*). Both tables are 32-bit
// rows read from shared memory, in 16 copies interleaved row by row (row e of copy c at (16 e + c)
// x 4 bytes, lane l reading copy l % 16: lanes l and l + 16 collide unless their rows' parities
// differ or the rows agree). x in its natural order (a[2 s] values 4 s .. 4 s + 3,
// a[2 s + 1] 16 + 4 s ..), so grid row r's two words go to a[4 r], a[4 r + 2] (r < 2) and a[4 r - 7],
// a[4 r - 5]. Per 8 values: two shared loads, an or, two prmt and a shift (the bf16 sums: a 16-byte
// load, the signs by four imad and lop3, a popc; the same integers, the same scales).
// IqInt8<T> per type (kHas), seen by the kernel through IntSumRows (with copies):
//   float decode_int8(b, k, a[8])   sub-block k of the block at b as u8 128 + value; returns db
//   (kInt8Halves: a scale per 16 values) float decode_int8_halves(b, k, a[8], f[2]): s8 values,
//                                   returns d / 8 and in f the halves' factors 2 n + 1
//   fill<Async>()                   the copies into shared memory (the block's setup)
//   kInt8Default, kInt8DefaultManyItems  int8 units by default at T = 1, as Fast<T>'s (int8_for)
// (16 copies each, filled 16 bytes (4 copies) per cp.async from the tables' rows written four times:
// 4-byte copies, 80 per thread of a 4-warp block, cost more than the units gained, H200)
__shared__ __align__(16) uint4 s_ksigns_nibbles_x16[128 * 4];
__shared__ __align__(16) uint4 s_iq2xxs_codes_x16[256 * 4];
__shared__ __align__(16) uint4 s_iq2xs_codes_x16[512 * 4];

// a 32-bit word of shared memory at a 32-bit shared address (not volatile: the addresses come from
// loads of the ring, which are ordered after the setup's wait; the compiler may schedule the loads)
__device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
// the lane's copy of a table of 16 copies of 32-bit rows interleaved row by row (a 16-byte word
// holds 4 copies of a row): its row e at base + e * 64
template <int N>
__device__ __forceinline__ uint32_t lane_copy(const uint4 (&t)[N]) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(t)) + (threadIdx.x & 15) * 4;
}

// 8 values of a grid row (codes c, a nibble each) with the signs sn (bit 2 of each nibble) from the
// 8 bytes {W0, W1}: values 0..3 into lo, 4..7 into hi
template <uint32_t W0, uint32_t W1>
__device__ __forceinline__ void grid_bytes8(uint32_t c, uint32_t sn, uint32_t& lo, uint32_t& hi) {
    const uint32_t sel = c | sn;
    lo = prmt(W0, W1, sel);
    hi = prmt(W0, W1, sel >> 16);
}

template <class T>
struct IqInt8 {
    static constexpr bool kHas = false;
};

// H200, T = 1, x the ceiling, against the bf16 sums with copies in the same run (docs/BENCHMARKS.md
// "IQ2"): deepseek-v3 0.24 -> 0.29 (98.1 -> 80.0 us), qwen3-30b-a3b 0.19 -> 0.21 (26.1 -> 23.8 us,
// gate_up only: down's rows of 3 chunks keep one grid and the bf16 sums)
template <>
struct IqInt8<IQ2_XXS> {
    static constexpr bool kHas = true, kInt8Default = true;
    __device__ static float decode_int8(const uint8_t* b, int k, uint32_t (&a)[8]) {
        const uint8_t* q = b + 2 + 8 * k;
        const uint32_t idx = ld_u32_a2(q), sg = ld_u32_a2(q + 4);
        const uint32_t codes = lane_copy(s_iq2xxs_codes_x16), signs = lane_copy(s_ksigns_nibbles_x16);
#pragma unroll
        for (int r = 0; r < 4; ++r)  // (byte r of idx by one prmt: its row's address by one lea)
            grid_bytes8<tb::iq2xxs_grid_u8_word0, tb::iq2xxs_grid_u8_word1>(
                lds_u32(codes + (prmt(idx, 0u, 0x4440u | r) << 6)), lds_u32(signs + (((sg >> (7 * r)) & 127) << 6)),
                a[r < 2 ? 4 * r : 4 * r - 7], a[r < 2 ? 4 * r + 2 : 4 * r - 5]);
        return half_bits(ld_u16(b)) * half_step(sg >> 28) * 0.25f;  // ggml's db, rounded as ggml's
    }
    template <bool>
    __device__ static void fill() {
        copy_table_copies<4>(s_iq2xxs_codes_x16, tb::iq2xxs_grid_codes_x4);
        copy_table_copies<4>(s_ksigns_nibbles_x16, tb::ksigns_nibbles_x4);
    }
};

// IQ2_XS: per 8 values a 16-bit word, the 9-bit row of a 512-row grid and a 7-bit ksigns index; a
// scale per 16 values, db = d (0.5 + n) / 4 = (d / 8) (2 n + 1): the values as s8 (kInt8Halves: the
// kernel sums each half apart and combines them by the integer factors 2 n + 1 in int32:
// |f0 I0 + f1 I1| <= 2 x 31 x 16 x 43 x 255 x 127 < 2^31)
// H200, T = 1: deepseek-v3 0.22 -> 0.26 (116.3 -> 100.4 us); qwen3-30b-a3b slower, 0.20 -> 0.18 (26.3 ->
// 28.6 us, gate_up only), so by default in phases of many items only (kInt8DefaultManyItems: deepseek-v3's)
template <>
struct IqInt8<IQ2_XS> {
    static constexpr bool kHas = true, kInt8Default = true, kInt8Halves = true, kInt8DefaultManyItems = true;
    __device__ static float decode_int8_halves(const uint8_t* b, int k, uint32_t (&a)[8], int (&f)[2]) {
        const uint8_t* q = b + 2 + 8 * k;
        const uint32_t w[2] = {ld_u32_a2(q), ld_u32_a2(q + 4)};
        const uint32_t codes = lane_copy(s_iq2xs_codes_x16), signs = lane_copy(s_ksigns_nibbles_x16);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const uint32_t v = (w[r >> 1] >> (16 * (r & 1))) & 0xFFFFu;
            grid_bytes8<tb::iq2xs_grid_s8_word0, tb::iq2xs_grid_s8_word1>(
                lds_u32(codes + ((v & 511) << 6)), lds_u32(signs + ((v >> 9) << 6)), a[r < 2 ? 4 * r : 4 * r - 7],
                a[r < 2 ? 4 * r + 2 : 4 * r - 5]);
        }
        const uint32_t sc = b[66 + k];
        f[0] = int(2 * (sc & 15) + 1), f[1] = int(2 * (sc >> 4) + 1);
        return half_bits(ld_u16(b)) * 0.125f;
    }
    template <bool>
    __device__ static void fill() {
        copy_table_copies<4>(s_iq2xs_codes_x16, tb::iq2xs_grid_codes_x4);
        copy_table_copies<4>(s_ksigns_nibbles_x16, tb::ksigns_nibbles_x4);
    }
};

FTW_HAS_MEMBER(HasPermute, permute);
FTW_HAS_MEMBER(HasPost, kPost);

__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

FTW_OPTIONAL_MEMBER(HasPrefetch, kPrefetch, bool, false);
FTW_OPTIONAL_MEMBER(MinFormOf, kMinForm, int, -1);  // Fast<T>::kMinForm, -1 for a type without mins
FTW_OPTIONAL_MEMBER(ValueFormOf, kValueForm, int, -1);  // Fast<T>::kValueForm, -1 for a type of one form

template <class T>
struct Tag {
    using type = T;
};

// g(Tag<T>), or g(Tag<WithMin<T, form>>) for a type with mins where FTW_GGUF_CUDA_MIN names the
// form it does not take by default, or g(Tag<WithValues<T, form>>) for IQ4_NL / IQ4_XS / MXFP4
// where FTW_GGUF_CUDA_VALUES names the form they do not take by default (read at every launch)
template <class T, class G>
void with_min_form(G&& g) {
    constexpr int kF = MinFormOf<Fast<T>>::value;
    if constexpr (kF >= 0) {
        static_assert(kMinHiLo + kMinShift == 1, "two forms: the other is 1 - kF");
        const int f = env_is("FTW_GGUF_CUDA_MIN", "hilo")    ? kMinHiLo
                      : env_is("FTW_GGUF_CUDA_MIN", "shift") ? kMinShift
                                                             : kF;
        if (f != kF) return g(Tag<WithMin<T, 1 - kF>>{});
    }
    if constexpr (ValueFormOf<Fast<T>>::value >= 0) {  // IQ4_NL, IQ4_XS, MXFP4: FTW_GGUF_CUDA_VALUES=0|1
        constexpr int kF = ValueFormOf<Fast<T>>::value;
        const int f = env_is("FTW_GGUF_CUDA_VALUES", "0")   ? kValueV0
                      : env_is("FTW_GGUF_CUDA_VALUES", "1") ? kValueV1
                                                            : kF;
        if (f != kF) return g(Tag<WithValues<T, 1 - kF>>{});
    }
    g(Tag<T>{});
}

// rows of n values of ggml type T: bytes
template <class T>
__host__ __device__ constexpr int64_t type_row_bytes(int64_t n) {
    return n / T::size.block_values * T::size.block_bytes;
}

// Whether the staged kernel decodes rows of type T with its byte columns (kOptByteCols: each lane of
// a quad sums its own units unscaled, their scales on the float32 sums; Fast<T>::kByteCols: Q4_0,
// MXFP4) at T = 1: where Fast<T>::kByteColsDefault says, =0 never, FTW_GGUF_CUDA_UNITCOLS=1 wherever
// T has them, and then rows of type T decode staged at T = 1 also where they would not
// (byte_cols_forced: launch_typed; benchmarks, tests; read at every launch)
FTW_OPTIONAL_MEMBER(ByteColsDefault, kByteColsDefault, bool, false);
template <class T>
bool byte_cols_for(const KernelParams& p) {
    if constexpr (!ByteCols<Fast<T>>::value) {
        return false;
    } else {
        if (p.T != 1 || env_is("FTW_GGUF_CUDA_UNITCOLS", "0")) return false;
        return env_is("FTW_GGUF_CUDA_UNITCOLS", "1") || ByteColsDefault<Fast<T>>::value;
    }
}
template <class T>
bool byte_cols_forced(const KernelParams& p) {
    return env_is("FTW_GGUF_CUDA_UNITCOLS", "1") && byte_cols_for<T>(p);
}

// Whether the staged kernel decodes a phase's rows of type T as int8 units on the IMMA (kOptInt8:
// Fast<T>::kInt8, Q4_0, MXFP4, IQ4_NL, IQ4_XS, and IQ3_XXS, IQ3_S from their grids in shared memory
// (kInt8Tables, Int8TableRows; IQ3_S's down by kInt8DefaultDown); phase 0 only with kOptInt8Sums:
// Fast<T>::kInt8Sums, Q4_K, Q5_K, their sub-blocks in the lane-blocks assignment; both phases where
// Fast<T>::kInt8SumsDown, Q2_K's units in kOptLanes16's kernel) at T = 1, with x (phase 0) or act
// (phase 1) quantized per 32-value group into the workspace first (quantize_int8); the phase then
// decodes staged also where it would not (launch_typed). FTW_GGUF_CUDA_INT8=1 in both phases
// wherever T has it, =gate_up / =down in that phase only, =0 never; unset where
// Fast<T>::kInt8Default says and, for kOptInt8, the phase has many items (staged_for_items: at least
// FTW_GGUF_CUDA_STAGED_ITEMS, 12, 16-row items per SM when every token picks the same experts; Q5_K's
// sub-block sums at any count, faster at both sizes: docs/BENCHMARKS.md "I8K"). As measured on the
// H200 (docs/BENCHMARKS.md "I8"; T = 1, x the ceiling, both phases against the defaults before, one
// run): deepseek-v3 (both phases many items) Q4_0 0.56 -> 0.62, MXFP4 0.44 -> 0.48, IQ4_NL 0.41 ->
// 0.53, IQ4_XS 0.43 -> 0.52; qwen3-30b-a3b (neither) slower, 0.41 -> 0.37, 0.38 -> 0.31, 0.36 ->
// 0.32, 0.38 -> 0.34 (read at every launch)
// Q2_K's unit sums (kInt8DefaultManyItems: kOptInt8's rule for a kOptInt8Sums decoder) where the
// phase has many items, so at deepseek-v3 and not at qwen3-30b-a3b, as measured (docs/BENCHMARKS.md
// "Q2"; H200, T = 1, x the ceiling, both phases against the lanes16 body in one run: deepseek-v3
// 71.7 -> 62.8 us, 0.40 -> 0.46; qwen3-30b-a3b 17.8 -> 18.1 us, gate_up alone 19.0).
FTW_OPTIONAL_MEMBER(Int8Default, kInt8Default, bool, false);
FTW_OPTIONAL_MEMBER(Int8DefaultManyItems, kInt8DefaultManyItems, bool, false);
// Fast<T>::kInt8DefaultDown: phase 1 (down) takes T's int8 units by default at any item count, phase 0
// as kInt8Default says (IQ3_S: down faster at both sizes, both phases slower at deepseek-v3)
FTW_OPTIONAL_MEMBER(Int8DefaultDown, kInt8DefaultDown, bool, false);
inline bool staged_for_items(const KernelParams& p, int phase);
inline bool int8_asked(int phase) {
    return env_is("FTW_GGUF_CUDA_INT8", "1") || env_is("FTW_GGUF_CUDA_INT8", phase == 0 ? "gate_up" : "down");
}
template <class T>
bool int8_for(const KernelParams& p, int phase) {
    constexpr bool iq = IqInt8<T>::kHas;  // (the IQ2 grids' units: IntSumRows with copies)
    if constexpr (!Int8Cols<Fast<T>>::value && !Int8Sums<Fast<T>>::value && !iq) {
        return false;
    } else {
        if (p.T != 1 || (phase == 0 ? p.xq : p.actq) == nullptr || env_is("FTW_GGUF_CUDA_INT8", "0")) return false;
        // (kOptInt8Sums: phase 0 only, but where the decoder takes down too: Q2_K; the IQ2 grids' units)
        if (!Int8Cols<Fast<T>>::value && !Int8SumsDown<Fast<T>>::value && !iq && phase != 0) return false;
        if (*env_or("FTW_GGUF_CUDA_INT8", "") != 0) return int8_asked(phase);
        using R = std::conditional_t<iq, IqInt8<T>, Fast<T>>;  // (where T's int8 default is declared)
        if (Int8DefaultDown<R>::value && phase == 1) return true;
        constexpr bool many = Int8Cols<R>::value || Int8DefaultManyItems<R>::value;
        return Int8Default<R>::value && (!many || staged_for_items(p, phase));
    }
}

// Whether a phase at T = 2..8 takes T's int8 units of several tokens (kOptInt8Tokens: Fast<T>::kInt8Tokens,
// Q4_0, IQ4_NL, IQ4_XS), only on rows the kernel's one body takes (Fast<T>::int8_tokens_rows: whole
// chunks, on 16-byte boundaries for the 144-byte ones), with x (act) quantized per token (pair) and
// chunk into the workspace first (quantize_int8_tokens); the phase then decodes staged also where it
// would not (launch_typed).
// FTW_GGUF_CUDA_INT8_T8=1 in both phases, =gate_up / =down in that phase only, =0 never; unset where the
// phase has many items (staged_for_items, kOptInt8's rule), as measured on the H200 (docs/BENCHMARKS.md
// "T8 measured"; T = 8 same experts, both phases against main's bf16 staged bodies in one run):
// deepseek-v3 Q4_0 104.0 -> 96.6 us, IQ4_NL 133.9 -> 118.8, IQ4_XS 124.3 -> 113.0 ("T8X"); qwen3-30b-a3b
// (few items) slower, Q4_0 24.2 -> 26.3, IQ4_NL 24.5 -> 29.7, IQ4_XS 23.3 -> 27.2 (read at every launch)
FTW_OPTIONAL_MEMBER(Int8TokensPost, kInt8TokensPost, float, 1.f);
template <class T>
bool int8_tokens_for(const KernelParams& p, int phase) {
    if constexpr (!Int8Tokens<Fast<T>>::value) {
        return false;
    } else {
        if (p.T < 2 || p.T > 8 || (phase == 0 ? p.xq : p.actq) == nullptr) return false;
        if (!Fast<T>::int8_tokens_rows(phase == 0 ? p.H : p.I)) return false;  // (the kernel's one body)
        if (*env_or("FTW_GGUF_CUDA_INT8_T8", "") == 0) return staged_for_items(p, phase);
        return env_is("FTW_GGUF_CUDA_INT8_T8", "1") || env_is("FTW_GGUF_CUDA_INT8_T8", phase == 0 ? "gate_up" : "down");
    }
}

// Fast<T>::kInt8Tables: T's int8 units read tables the block keeps in shared memory (IQ3_XXS, IQ3_S:
// fill_int8_tables), so only Int8TableRows takes them
FTW_OPTIONAL_MEMBER(Int8Tables, kInt8Tables, bool, false);

// experts_decode_staged's byte-stream interface for rows of type T (csrc/cuda/experts_kernels.cuh):
// a chunk of 256 values is whole blocks (one K/IQ super-block, or 8 blocks of 32); a block starts
// at a multiple of gcd(16, its bytes) on a 16-byte-aligned bank, which bounds the 16-byte pieces
// covering a chunk (kSpan). decode_staged reads the unit's bytes with the same Fast<T>::load as
// the register-fed kernels, from the shared-memory ring instead of global memory.
template <class T, class M>
struct StagedRows {
    using F = Fast<T>;
    static constexpr bool kStaged = true;
    static constexpr bool kShortRing = ShortRing<F>::value;  // rings of 2 stages where T asks for them
    static constexpr int kChunkBytes = 256 / T::size.block_values * T::size.block_bytes;
    static constexpr int kAlign = T::size.block_bytes % 16 == 0 ? 16 : T::size.block_bytes & -T::size.block_bytes;
    static constexpr int kSpan = (16 - kAlign + kChunkBytes + 15) / 16;
    __device__ static const uint8_t* weights(const KernelParams& p, int proj, int slot) { return bank_row(p, proj, slot); }
    __device__ static int64_t weight_row_bytes(const KernelParams& p, int proj) {
        return type_row_bytes<T>(proj == 0 ? p.H : p.I);
    }
    __device__ static void decode_staged(const uint8_t* b, int k, uint32_t (&w)[16]) {
        if constexpr (LoadsTables<M>::value)
            F::decode_tables(F::template load<M>(b, k), w);
        else
            F::decode(F::template load<M>(b, k), w);
    }
    // the byte columns where F has them (kOptByteCols: Q4_0, MXFP4), at T = 1 where byte_cols_for<T>
    // says
    static constexpr bool kByteCols = ByteCols<F>::value && !LoadsTables<M>::value;
    static constexpr bool kByteColsX = ByteColsX<F>::value;
    __device__ static float decode_cols(const uint8_t* b, int k, uint32_t (&w)[16]) {
        return F::decode_cols(F::template load<M>(b, k), w);
    }
    static bool byte_cols(const KernelParams& p) { return byte_cols_for<T>(p); }
    // int8 units where F has them (kOptInt8: Q4_0, MXFP4, IQ4_NL, IQ4_XS; the types whose int8 units
    // read tables, IQ3_XXS and IQ3_S, in Int8TableRows), at T = 1 where int8_for<T> says for the phase
    // (a type whose int8 units read shared-memory tables, kInt8Tables, takes them in Int8TableRows)
    static constexpr bool kInt8 = Int8Cols<F>::value && !LoadsTables<M>::value && !Int8Tables<F>::value;
    static constexpr bool kInt8Interleaved = Int8Interleaved<F>::value;
    static constexpr int kInt8Offset = Int8Offset<F>::value;
    __device__ static float decode_int8(const uint8_t* b, int k, uint32_t (&a)[8]) {
        return F::decode_int8(F::template load<M>(b, k), a);
    }
    static bool int8(const KernelParams& p, int phase) { return int8_for<T>(p, phase); }
    // int8 units of several tokens where F has them (kOptInt8Tokens: Q4_0, IQ4_NL, IQ4_XS), at T = 2..8 where
    // int8_tokens_for<T> says for the phase (the ring read by 16-byte LDS whatever M says)
    static constexpr bool kInt8Tokens = Int8Tokens<F>::value && !LoadsTables<M>::value;
    static constexpr float kInt8TokensPost = Int8TokensPost<F>::value;
    __host__ __device__ static constexpr int int8_tokens_slot(int u, int v) { return F::int8_tokens_slot(u, v); }
    static constexpr bool kInt8TokensIntScales = Int8TokensIntScales<F>::value;
    template <class S>  // (float, or int with kInt8TokensIntScales)
    __device__ static float int8_tokens_row(const uint8_t* row, int tig, uint32_t (&a)[8], S (&d)[8]) {
        return F::int8_tokens_row(row, tig, a, d);
    }
    __device__ static void int8_tokens_split(uint32_t w, uint32_t& lo, uint32_t& hi) { F::int8_tokens_split(w, lo, hi); }
    static bool int8_tokens(const KernelParams& p, int phase) { return int8_tokens_for<T>(p, phase); }
};
// with TableLoads and shared-memory tables: the block's tables filled before its first decode
// (experts_decode_staged's block_setup)
template <class T, class M, bool = LoadsTables<M>::value && HasFill<Fast<T>>::value>
struct StagedRowsOf : StagedRows<T, M> {};
template <class T, class M>
struct StagedRowsOf<T, M, true> : StagedRows<T, M> {
    static constexpr bool kSetupAsync = M::kAsync;
    __device__ static void block_setup() { Fast<T>::template fill_tables<M::kAsync>(); }
};
struct RegisterFedOnly {};
// The staged decoder (Dec: TypedDecoder<T, .., true, SharedLoads>) of a phase whose rows of type T
// take int8 units read from T's shared-memory tables (Fast<T>::kInt8Tables: IQ3_XXS, IQ3_S), which
// launch_typed picks only where int8_for says, so its launch makes the int8 kernel alone (kInt8Only:
// a ring of 2 stages, as the other int8 types'): its blocks fill the tables by cp.async, waited for
// after the routing. Measured and dropped (docs/BENCHMARKS.md "IQ3 int8", commit 05858aa has it):
// the grid in 16 copies, blocks of 4 warps, as IntSumRows' (H200, T = 1, deepseek-v3 IQ3_XXS 105.5
// -> 116.6 us, IQ3_S 120.1 -> 139.4; qwen3-30b-a3b 25.3 -> 40.0, 28.2 -> 48.5)
template <class T, class Dec>
struct Int8TableRows : Dec {
    static_assert(Int8Tables<Fast<T>>::value && Int8Cols<Fast<T>>::value, "int8 units from tables");
    static constexpr bool kInt8 = true, kInt8Only = true, kSetupAsync = true;
    __device__ static void block_setup() { Fast<T>::template fill_int8_tables<true>(); }
};

// The kernels' decoder for rows of ggml type T (T has a Fast<T>). Three ways of having a unit's
// bytes at hand when it is decoded: Loaded (Fast<T>::load's registers are the register-fed ring's
// Raw), Prefetched (load() only asks the L1 for the unit's block, and decode() reads it from
// there with Fast<T>::load: types whose Raw is large, Q5_K, Q6_K, Q3_K with 21-27 registers, do
// not spill the ring), and Staged (StagedRows: decode runs experts_decode_staged, which copies
// each row's chunks into shared memory by cp.async, many bytes in flight without registers;
// prefill and FTW_CUDA_DECODE=classic keep the register-fed way Fast<T>::kPrefetch picks).
// The defaults per type (kPrefetch, kStaged) come from measurements (docs/BENCHMARKS.md).
template <class T, bool Prefetched, bool Staging, class M = SharedLoads>
struct TypedDecoder : std::conditional_t<Staging, StagedRowsOf<T, M>, RegisterFedOnly> {
    using F = Fast<T>;
    using Classic = TypedDecoder<T, Prefetched, false>;  // the register-fed kernels' instantiation
    static constexpr int VEC = 32;
    using Row = const uint8_t*;
    struct Deferred {
        const uint8_t* row;  // nullptr: a unit past the row (zeros)
        int u;
    };
    using Raw = std::conditional_t<Prefetched, Deferred, typename F::Raw>;
    // gate_up: gate's I rows then up's I rows, both of type T; down: H rows
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        return bank_row(p, proj, slot) + int64_t(r) * type_row_bytes<T>(proj == 0 ? p.H : p.I);
    }
    __device__ static Raw load(Row row, int u) {
        if constexpr (Prefetched) {
            constexpr int per = T::size.block_values / 32, L = T::size.block_bytes;
            const uint8_t* b = row + int64_t(u / per) * L;
#pragma unroll
            for (int i = 0; i < L; i += 128) prefetch_l1(b + i);
            prefetch_l1(b + L - 1);
            return {row, u};
        } else {
            return F::load(row, u);
        }
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[16]) {
        if constexpr (Prefetched) {
            if (raw.row == nullptr) {
#pragma unroll
                for (int i = 0; i < 16; ++i) w[i] = 0u;
                return;
            }
            F::decode(F::load(raw.row, raw.u), w);
        } else {
            F::decode(raw, w);
        }
    }
    __device__ static void permute(const uint32_t (&x)[16], uint32_t (&a)[16]) {
        if constexpr (HasPermute<F>::value)
            F::permute(x, a);
        else
            permute_identity(x, a);
    }
    __device__ static float post(const KernelParams&, int, int, int) {
        if constexpr (HasPost<F>::value)
            return F::kPost;
        else
            return 1.0f;
    }
};

// A register-fed TypedDecoder in experts_decode's shaped loop (RegisterShape, as bf16 and
// fp8_block run): x loaded when its chunk is used rather than in every lane's ring (at T=1 only
// 4 lanes of 32 use it), each unit refilled as soon as it is decoded, loads unpredicated, and
// phase 1 a programmatic dependent launch of phase 0. Decode only (prefill keeps Dec).
// FTW_CUDA_REGISTER_SHAPE=legacy keeps the legacy loop (the bench's rs-legacy).
template <class Dec>
struct ShapedDecoder : Dec {
    using RegisterShape = ::ftw::cuda::RegisterShape<0, 0, false, 128, false, 0, true>;
    using Classic = ShapedDecoder;
};

// A staged TypedDecoder of a type with the sub-block interface (Fast<T>::kSubBlocks: Q4_K, Q5_K
// with 32-value sub-blocks, Q2_K, Q3_K, Q6_K with 16-value ones): experts_decode_staged decodes its
// quants as exact integers and applies the sub-blocks' scales and mins to float32 sums
// (staged_sub_block_chunk; its ring 2 stages, launch_decode). The default for those types;
// FTW_GGUF_CUDA_SUBBLOCKS=0 runs the bf16 decode (decode_staged, or Q2_K's values table) for every
// one, =32 for the 16-value types only (sub_block_scales).
//
// ChunkD (Q2_K, Q3_K, Q6_K: FTW_GGUF_CUDA_CHUNK_D, chunk_d below) applies each row's d (and dmin)
// once per chunk: Q6_K's scales as exact integers on the sums (kUnitScales), Q3_K's and Q2_K's in
// the mma (kScaledInts, decode_scaled; Q2_K's mins in a second mma chain, min_pair); without it
// they take d * sc per sub-block (sub_scale). Wide (Q2_K, Q3_K: FTW_GGUF_CUDA_WIDE, wide_lanes below)
// gives the lanes a 32-value sub-block's shape (decode_wide, kWideLanes), each lane's 8 values of a
// unit in one sub-block; without it a pair of scales per sub-block (decode_scaled).
FTW_HAS_MEMBER(HasUnitScale, unit_scale);
FTW_HAS_MEMBER(HasDecodeScaled, decode_scaled);
FTW_HAS_MEMBER(HasDecodeWide, decode_wide);
FTW_HAS_MEMBER(HasAlignedBody, kAlignedBody);
template <class F>
constexpr bool kHasChunkD = HasUnitScale<F>::value || HasDecodeScaled<F>::value;
template <class Dec, bool ChunkD = false, bool Wide = false, bool Aligned = false>
struct SubBlockRows : Dec {
    using F = typename Dec::F;
    static constexpr bool kSubBlocks = true;
    static constexpr int kSubBlockValues = SubBlockValues<F>::value;
    static constexpr bool kSubBlockMins = SubBlockMins<F>::value;
    static constexpr bool kUnitScales = ChunkD && HasUnitScale<F>::value;
    static constexpr bool kScaledInts = ChunkD && HasDecodeScaled<F>::value;
    static constexpr bool kWideLanes = kScaledInts && Wide;
    using Head = typename F::Head;
    // Aligned (Q3_K with wide lanes unless FTW_GGUF_CUDA_ALIGNED=0, aligned_body below): the staged kernel
    // runs a second chunk body, with A4, where both of a lane's blocks, in every lane, start on a
    // 4-byte boundary (Ring4: no funnel shift, one load per word)
    static constexpr bool kAligned4 = Aligned;
    template <bool A4 = false>
    __device__ static Head head(const uint8_t* b) {
        if constexpr (A4)
            return F::template head<Ring4>(b);
        else
            return F::head(b);
    }
    __device__ static void sub_scale(const Head& h, int j, float& s, float& n) {
        if constexpr (kUnitScales)
            s = F::unit_scale(h, j), n = 0.f;
        else
            F::sub_scale(h, j, s, n);
    }
    __device__ static float head_d(const Head& h) { return F::head_d(h); }
    __device__ static float head_dmin(const Head& h) { return F::head_dmin(h); }
    __device__ static uint32_t min_pair(const Head& h, int j) { return F::min_pair(h, j); }
    static constexpr bool kSplitValues = SplitValues<F>::value;
    static constexpr int kSumOffset = SumOffset<F>::value;
    __device__ static uint32_t min_pair_lane(const Head& h, int c2, int e, int tig) { return F::min_pair_lane(h, c2, e, tig); }
    // the lane-blocks interface where F has it (kOptLaneBlocks: Q4_K, Q5_K)
    static constexpr bool kLaneBlocks = LaneBlocks<F>::value;
    static constexpr bool kLaneBlocksDefault = LaneBlocksDefault<F>::value;
    __device__ static auto lane_head(const uint8_t* b, int tig) { return F::lane_head(b, tig); }
    template <class H>
    __device__ static void lane_scale(const H& h, int e, float& s, float& n) { F::lane_scale(h, e, s, n); }
    template <int N>
    __device__ static void decode_lane(const uint8_t* b, int tig, int p, uint32_t (&w)[2][N]) { F::decode_lane(b, tig, p, w); }
    // the int8 lane interface where F has it (kOptInt8Sums: Q4_K, Q5_K), phase 0 at T = 1 where the
    // inherited int8 (int8_for) says
    static constexpr bool kInt8Sums = Int8Sums<F>::value;
    __device__ static void decode_lane_int8(const uint8_t* b, int tig, uint32_t (&a)[2][8]) { F::decode_lane_int8(b, tig, a); }
    template <class H>
    __device__ static void lane_scale_min(const H& h, int e, float& s, float& m) { F::lane_scale_min(h, e, s, m); }
    // and for 16-value sub-blocks (Q2_K, with kOptLanes16): their mins by a second IMMA chain, phase 1 too
    static constexpr bool kInt8Mins16 = Int8Mins16<F>::value, kInt8SumsDown = Int8SumsDown<F>::value;
    template <class H>
    __device__ static void lane_mins_int8(const H& h, uint32_t (&m)[2][2]) { F::lane_mins_int8(h, m); }
    // the lane-blocks interface of 16-value sub-blocks where F has it (kOptLanes16: Q6_K, Q2_K), with
    // d (and dmin) once per chunk as its body applies them
    static constexpr bool kLanes16 = ChunkD && Lanes16<F>::value;
    static constexpr bool kLanes16Default = Lanes16Default<F>::value;
    static constexpr int kLaneBias16 = LaneBias16<F>::value;
    __device__ static auto lane_head16(const uint8_t* b, int tig) { return F::lane_head16(b, tig); }
    template <class H>
    __device__ static float lane_scale16(const H& h, int s) { return F::lane_scale16(h, s); }
    template <class H>
    __device__ static float lane_d16(const H& h) { return F::lane_d16(h); }
    template <class H>
    __device__ static float lane_min16(const H& h, int s) { return F::lane_min16(h, s); }
    template <class H>
    __device__ static float lane_dmin16(const H& h) { return F::lane_dmin16(h); }
    __device__ static void decode_lane16(const uint8_t* b, int tig, int i, uint32_t (&w)[4][2]) { F::decode_lane16(b, tig, i, w); }
    template <int N>
    __device__ static void decode_pair(const uint8_t* b, int c2, int tig, uint32_t (&w)[2][N]) {
        F::decode_pair(b, c2, tig, w);
    }
    template <bool A4 = false>
    __device__ static void decode_scaled(const uint8_t* b, const Head& h, int c2, int tig, uint32_t (&w)[2][4]) {
        if constexpr (Wide && A4)
            F::template decode_wide_in<Ring4>(b, h, c2, tig, w);
        else if constexpr (Wide)
            F::decode_wide(b, h, c2, tig, w);
        else
            F::decode_scaled(b, h, c2, tig, w);
    }
};
// whether Q2_K / Q3_K / Q6_K rows on sub-block sums apply d once per chunk (ChunkD): unless
// FTW_GGUF_CUDA_CHUNK_D=0 (benchmarks, tests; read at every launch)
inline bool chunk_d() { return !env_is("FTW_GGUF_CUDA_CHUNK_D", "0"); }
// Whether rows of type T whose chunk holds several blocks (Q8_0: 8 of 32 values) run on float32
// sub-block sums in phase `phase`: where its rows are whole chunks (in values a multiple of 256;
// the staged decode without sums covers a partial last chunk), unless FTW_GGUF_CUDA_Q8_SUMS=0
// (benchmarks, tests; read at every launch). Types of 256-value blocks: always.
template <class T>
bool sub_block_rows(const KernelParams& p, int phase) {
    if constexpr (T::size.block_values >= 256)
        return true;
    else
        return !env_is("FTW_GGUF_CUDA_Q8_SUMS", "0") && (phase == 0 ? p.H : p.I) % 256 == 0;
}
// whether Q2_K / Q3_K rows with d once per chunk take wide lanes: unless FTW_GGUF_CUDA_WIDE=0
// (benchmarks, tests; read at every launch)
inline bool wide_lanes() { return !env_is("FTW_GGUF_CUDA_WIDE", "0"); }
// whether Q3_K rows with wide lanes take the aligned chunk body too (SubBlockRows' Aligned): where
// unless FTW_GGUF_CUDA_ALIGNED=0 (benchmarks, tests; read at every launch). Measured faster (H200,
// docs/BENCHMARKS.md "Q3": deepseek-v3 T=1 91 -> 87 us with the whole-block copies)
inline bool aligned_body() { return !env_is("FTW_GGUF_CUDA_ALIGNED", "0"); }
// Whether rows of type T (with the sub-block interface) run on float32 sub-block sums: unless
// FTW_GGUF_CUDA_SUBBLOCKS=0, or =32 for a type of 16-value sub-blocks; a type with a values table
// (Q2_K) takes it where FTW_GGUF_CUDA_TABLES=1 | async asks for it (read at every launch)
template <class T>
bool sub_block_scales() {
    if (env_is("FTW_GGUF_CUDA_SUBBLOCKS", "0")) return false;
    if (SubBlockValues<Fast<T>>::value == 32) return true;
    return !env_is("FTW_GGUF_CUDA_SUBBLOCKS", "32") && !env_is("FTW_GGUF_CUDA_TABLES", "1") &&
           !env_is("FTW_GGUF_CUDA_TABLES", "async");
}

// A staged TypedDecoder of an IQ type on float32 sub-block sums (IqInt<T>: the grid values as
// exact signed integers, the scales on the sums; experts_decode_staged's kIntSums interface,
// staged_int_sum_chunk; its ring 2 stages, launch_decode): IQ2_XXS, IQ2_XS and IQ3_S's default
// decode (IqInt<T>::kDefault); FTW_GGUF_CUDA_INTSUMS=0 runs the decode they had before
// (decode_tables), =1 IQ3_XXS's too (register-fed by default).
// Copies: the grid in copies (IqCopies<T>; blocks of 4 warps, the copies waited for after the first
// ring stages are in flight), where grid_copies says.
template <class T, class Dec, bool Copies = false>
struct IntSumRows : Dec {
    using I = IqInt<T>;
    static_assert(I::kHas && Dec::kChunkBytes == T::size.block_bytes, "a chunk is one IQ super-block");
    static_assert(!Copies || IqCopies<T>::kHas, "a type with copies");
    static constexpr bool kIntSums = true;
    static constexpr int kScaleGroup = I::kScaleGroup;
    static constexpr bool kSetupAsync = true;  // the grids by cp.async, waited for after the routing
    static constexpr bool kSetupLate = Copies;
    static constexpr int kBlockWarps = Copies ? 4 : 0;
    __device__ static void block_setup() {
        if constexpr (Copies)
            IqCopies<T>::template fill<true>();
        else
            I::template fill_int_tables<true>();
    }
    __device__ static float head(const uint8_t* b) { return I::head(b); }
    __device__ static void int_values(const uint8_t* b, int j, int tig, uint32_t (&w)[4], float (&s)[2]) {
        if constexpr (Copies)
            IqCopies<T>::int_values(b, j, tig, w, s);
        else
            I::int_values(b, j, tig, w, s);
    }
    // int8 units where T has them (IqInt8<T>: IQ2_XXS, IQ2_XS), with copies (phases of 8 chunks or more),
    // at T = 1 where int8_for<T> says for the phase; their own tables in the block's setup
    static constexpr bool kInt8 = Copies && IqInt8<T>::kHas, kInt8Interleaved = false;
    static constexpr bool kInt8Halves = Int8Halves<IqInt8<T>>::value;  // (IQ2_XS: s8, no offset)
    static constexpr int kInt8Offset = kInt8Halves ? 0 : 128;
    __device__ static float decode_int8(const uint8_t* b, int k, uint32_t (&a)[8]) {
        return IqInt8<T>::decode_int8(b, k, a);
    }
    __device__ static float decode_int8_halves(const uint8_t* b, int k, uint32_t (&a)[8], int (&f)[2]) {
        return IqInt8<T>::decode_int8_halves(b, k, a, f);
    }
    __device__ static void block_setup_int8() { IqInt8<T>::template fill<true>(); }
    static bool int8(const KernelParams& p, int phase) { return int8_for<T>(p, phase); }
};
// whether phase `phase` of rows of IQ type T on sums reads its grid in copies (IqCopies<T>): where
// its rows have at least 8 chunks (so its blocks of 4 warps get 2 chunks each: at the qwen3-30b-a3b
// size down's rows have 3), or everywhere with FTW_GGUF_CUDA_GRID_COPIES=1, nowhere with =0
// (benchmarks, tests; read at every launch)
template <class T>
bool grid_copies(const KernelParams& p, int phase) {
    if constexpr (!IqCopies<T>::kHas) {
        return false;
    } else {
        if (env_is("FTW_GGUF_CUDA_GRID_COPIES", "0")) return false;
        return env_is("FTW_GGUF_CUDA_GRID_COPIES", "1") || (phase == 0 ? p.H : p.I) / 256 >= 8;
    }
}

FTW_OPTIONAL_MEMBER(DefaultWithCopies, kDefaultWithCopies, bool, false);

// whether rows of IQ type T decode on float32 sums: IqInt<T>::kDefault, or kDefaultWithCopies
// where both phases of the layer read their grid in copies (grid_copies), or for every IQ type
// with FTW_GGUF_CUDA_INTSUMS=1, for none with =0 (benchmarks, tests; read at every launch)
template <class T>
bool int_sums(const KernelParams& p) {
    if (env_is("FTW_GGUF_CUDA_INTSUMS", "1")) return true;
    if (env_is("FTW_GGUF_CUDA_INTSUMS", "0")) return false;
    return IqInt<T>::kDefault || (DefaultWithCopies<IqInt<T>>::value && grid_copies<T>(p, 0) && grid_copies<T>(p, 1));
}

// Fast<T>::kStagedManyItems (Q4_0, MXFP4): rows of type T decode staged (rings of 2 stages,
// kShortRing) in a phase of many items, register-fed in the shaped loop otherwise. As measured on
// the H200 (docs/BENCHMARKS.md "G4"; T=1, x the ceiling, staged against register-fed): deepseek-v3
// Q4_0 0.54 against 0.45, MXFP4 0.42 against 0.40 (T=8 same 0.38 against 0.35); qwen3-30b-a3b
// Q4_0 0.34 against 0.40, MXFP4 0.30 against 0.38. What separates the sizes: the phase's 16-row
// items when every token picks the same experts, 15.5 (gate_up) and 27 (down) per SM at
// deepseek-v3, 5.8 and 7.8 at qwen3-30b-a3b (as for the fp4 formats' 32-row stages,
// staged_rows32). So at least FTW_GGUF_CUDA_STAGED_ITEMS (12) such items per SM; =0: always.
FTW_OPTIONAL_MEMBER(StagedManyItems, kStagedManyItems, bool, false);
// The experts a decode step's T tokens route to, for the item count. The launch cannot see the
// routing (it is on the device, and the step may be captured in a graph), so at T = 4..8 it takes
// what independent tokens give on average, E (1 - (1 - K / E)^T) (about 52 of 128 at K = 8, T = 8),
// not the K of tokens that all pick the same experts: serving batches are independent tokens. As
// measured on the H200 (docs/BENCHMARKS.md "Routed experts in the item count"; qwen3-30b-a3b, the
// size where the two counts decide differently; Q4_0, IQ4_NL, IQ4_XS, MXFP4, us against K's rule):
// independent routings at T = 8 1.32-1.54x faster, at T = 4 1.17-1.30x; the same experts 8-16%
// slower at T = 8, 13-18% at T = 4. T = 2 and 3 keep K: independent routings there gained -1% to
// 12% against the same experts' 12-18% loss. FTW_GGUF_CUDA_ROUTING=same takes K at every T (the rule
// before); T = 1 and prefill (T > 8) always do.
inline double routed_experts(const KernelParams& p) {
    const int E = p.num_experts, K = std::min(p.K, E);
    if (p.T < 4 || p.T > 8 || env_is("FTW_GGUF_CUDA_ROUTING", "same")) return K;
    return E * (1.0 - std::pow(1.0 - double(K) / E, p.T));
}
inline bool staged_for_items(const KernelParams& p, int phase) {
    const int n = env_int("FTW_GGUF_CUDA_STAGED_ITEMS", 12);
    const int64_t bands = phase == 0 ? (p.I + 7) / 8 : (p.H + 15) / 16;
    return double(bands) * routed_experts(p) >= double(n) * device_sms();
}

// The type list as a type (the one list above), for the slices.
template <class... Ts>
struct TypeList {};
#define FTW_GGML_LIST_ENTRY(T) T,
using CudaTypes = TypeList<FTW_GGML_CUDA_TYPES(FTW_GGML_LIST_ENTRY) void>;
#undef FTW_GGML_LIST_ENTRY

// Fast<T>::kGenericShared: the staged kernel reads with SharedLoadsGeneric
FTW_OPTIONAL_MEMBER(GenericSharedDefault, kGenericShared, bool, false);

// How the staged kernel reads its ring for rows of type T: SharedLoadsGeneric where T says so
// (kGenericShared) or FTW_GGUF_CUDA_SHARED=generic, SharedLoads where it does not or
// FTW_GGUF_CUDA_SHARED=shared (the bench's comparisons)
template <class T>
bool generic_shared_loads() {
    return env_is("FTW_GGUF_CUDA_SHARED", "generic") ||
           (!env_is("FTW_GGUF_CUDA_SHARED", "shared") && GenericSharedDefault<Fast<T>>::value);
}

// Fast<T>::kTables: the staged kernel decodes rows of type T with its tables by default
FTW_OPTIONAL_MEMBER(TablesDefault, kTables, bool, false);

// Whether the staged kernel decodes rows of type T, whose Fast<T> has decode_tables (the IQ grids
// in shared memory, Q2_K's values in registers), with them (TableLoads): as Fast<T>::kTables says,
// or for every such type with FTW_GGUF_CUDA_TABLES=1 or =async, for none with =0 (the bench's
// comparisons; read at every launch). The IQ grids (Fast<T>::fill_tables) are copied by cp.async,
// overlapping the block's routing, except with =1 (loads and stores before the routing: slower
// at the qwen3-30b-a3b size, docs/BENCHMARKS.md).
template <class T>
bool decode_with_tables() {
    return env_is("FTW_GGUF_CUDA_TABLES", "1") || env_is("FTW_GGUF_CUDA_TABLES", "async") ||
           (!env_is("FTW_GGUF_CUDA_TABLES", "0") && TablesDefault<Fast<T>>::value);
}

}  // namespace

// ---- launchers, across translation units ---------------------------------------------------------

// How a launch picks decoders: FTW_GGUF_CUDA_DECODER unset: each type as its Fast<T> says
// (kStaged, kPrefetch); "table": the table-driven decoder for every projection; "staged" /
// "loaded" / "prefetched": every type with a decoder of its own that way (the last four for the
// tests and the bench's comparisons; read at every launch).
enum class GgufMode { kPerType, kTable, kStaged, kLoaded, kPrefetched };

// One projection's launch (phase 0: gate_up, 1: down) with its type's decoder chosen by mode.
using GgufPhaseLaunch = void (*)(int phase, GgufMode mode, const KernelParams& p, cudaStream_t stream);

// The slices register a launcher per type id (kTableDriven: the table-driven decoder), launch.cu
// looks them up.
constexpr int kTableDriven = -1;
void register_gguf_launch(int type_id, GgufPhaseLaunch launch);

}  // namespace ftw::cuda
