// ggml's block types: one struct per type (its block decoder), one table that registers them.
//
// Each decoder follows ggml's dequantize_row_<type> operation by operation (and so gguf.quants,
// which mirrors ggml bit for bit): the float32 products are rounded in the same order, so
// to_float is bit-exact. Sizes, grids, sign and value tables come from the generated
// ggml_tables.h (gen_tables.py reads them from the gguf package at build time).
//
// dot: the portable kernel decodes one block into a stack buffer (L1) and multiplies it into
// 16 float lanes; the AVX2 kernels (x86-64, chosen at run time so a portable build still gets
// them) decode in registers and fold each block's scale in once per sub-block.
#include "formats/gguf/ggml_types.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/numerics.h"
#include "ggml_tables.h"  // generated into the build tree by gen_tables.py

// to_float must round every product like ggml does, so a compiler must not fuse a*b+c into an
// FMA here (GCC fuses by default when FMA is enabled). The AVX2 dots use explicit FMA intrinsics,
// which this does not affect.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FTW_GGML_X86 1
#include <immintrin.h>
#define FTW_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ggml blocks are little-endian");

namespace ftw::ggml {
namespace {

namespace tb = tables;

inline uint16_t rd16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline uint32_t rd32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

using num::bits_to_f32;

inline float half_at(const uint8_t* p) { return num::f16_to_f32(rd16(p)); }

// ggml_e8m0_to_fp32_half: 2^(e-127) / 2 (MXFP4's values are stored doubled)
inline float e8m0_half(uint8_t e) {
    return bits_to_f32(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23);
}

// +1 or -1 from bit j, without a branch (the bits are random: a branch mispredicts half the time)
inline float sign_of(uint8_t signs, int j) { return float(1 - 2 * int((signs >> j) & 1)); }

// Decode streams weight rows from DRAM, and a dot does enough work per byte that the hardware
// prefetchers fall behind: each kernel asks for the block kPrefetchAhead bytes ahead of the one it
// decodes (measured on one core: Q8_0 from DRAM 0.37x -> 0.93x of the read bandwidth). A prefetch
// past the end of a buffer is harmless (never faults).
constexpr int kPrefetchAhead = 4096;

template <int S>
inline void prefetch_block(const uint8_t* b) {
    for (int o = 0; o < S; o += 64) __builtin_prefetch(b + kPrefetchAhead + o, 0, 3);
}

// ---------------------------------------------------------------------------------------------
// One struct per type: `size` (from the generated table) and `block(b, y)`, which writes the
// block's block_values floats. Layout comments give byte offsets inside one block.

struct F32 {
    static constexpr tb::Size size = tb::size::F32;
    static void block(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
};

struct F16 {
    static constexpr tb::Size size = tb::size::F16;
    static void block(const uint8_t* b, float* y) { y[0] = half_at(b); }
};

struct BF16 {
    static constexpr tb::Size size = tb::size::BF16;
    static void block(const uint8_t* b, float* y) { y[0] = num::bf16_to_f32(rd16(b)); }
};

// d:f16 | qs:int8[32]
struct Q8_0 {
    static constexpr tb::Size size = tb::size::Q8_0;
    static_assert(size.block_bytes == 2 + 32, "Q8_0 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
    }
};

// d:f16 | qs[16]: value j low nibble, value j+16 high nibble; value = d * (q - 8)
struct Q4_0 {
    static constexpr tb::Size size = tb::size::Q4_0;
    static_assert(size.block_bytes == 2 + 16, "Q4_0 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint8_t* qs = b + 2;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * float((qs[j] & 15) - 8);
            y[j + 16] = d * float((qs[j] >> 4) - 8);
        }
    }
};

// d:f16 | m:f16 | qs[16]; value = d * q + m
struct Q4_1 {
    static constexpr tb::Size size = tb::size::Q4_1;
    static_assert(size.block_bytes == 4 + 16, "Q4_1 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b), m = half_at(b + 2);
        const uint8_t* qs = b + 4;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * float(qs[j] & 15) + m;
            y[j + 16] = d * float(qs[j] >> 4) + m;
        }
    }
};

// d:f16 | qh:u32 (bit j = 5th bit of value j) | qs[16]; value = d * (q - 16)
struct Q5_0 {
    static constexpr tb::Size size = tb::size::Q5_0;
    static_assert(size.block_bytes == 2 + 4 + 16, "Q5_0 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint32_t qh = rd32(b + 2);
        const uint8_t* qs = b + 6;
        for (int j = 0; j < 16; ++j) {
            const int lo = (qs[j] & 15) | int((qh >> j) & 1) << 4;
            const int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
            y[j] = d * float(lo - 16);
            y[j + 16] = d * float(hi - 16);
        }
    }
};

// d:f16 | m:f16 | qh:u32 | qs[16]; value = d * q + m
struct Q5_1 {
    static constexpr tb::Size size = tb::size::Q5_1;
    static_assert(size.block_bytes == 4 + 4 + 16, "Q5_1 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b), m = half_at(b + 2);
        const uint32_t qh = rd32(b + 4);
        const uint8_t* qs = b + 8;
        for (int j = 0; j < 16; ++j) {
            const int lo = (qs[j] & 15) | int((qh >> j) & 1) << 4;
            const int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
            y[j] = d * float(lo) + m;
            y[j + 16] = d * float(hi) + m;
        }
    }
};

// scales[16] (low nibble scale, high nibble min, per 16 values) | qs[64] | d:f16 | dmin:f16.
// Value v = 128h + 32s + l is bits 2s..2s+1 of qs[32h + l].
struct Q2_K {
    static constexpr tb::Size size = tb::size::Q2_K;
    static_assert(size.block_bytes == 16 + 64 + 2 + 2, "Q2_K layout");
    static void block(const uint8_t* b, float* y) {
        const uint8_t* sc = b;
        const uint8_t* qs = b + 16;
        const float d = half_at(b + 80), dmin = half_at(b + 82);
        for (int h = 0; h < 2; ++h)
            for (int s = 0; s < 4; ++s)
                for (int half16 = 0; half16 < 2; ++half16) {
                    const int v0 = 128 * h + 32 * s + 16 * half16;
                    const float dl = d * float(sc[v0 / 16] & 15), ml = dmin * float(sc[v0 / 16] >> 4);
                    for (int l = 0; l < 16; ++l) {
                        const int q = (qs[32 * h + 16 * half16 + l] >> (2 * s)) & 3;
                        y[v0 + l] = dl * float(q) - ml;
                    }
                }
    }
};

// hmask[32] | qs[64] | scales[12] (16 6-bit scales, offset 32) | d:f16.
// Value v: low 2 bits as Q2_K; bit v/32 of hmask[v%32] clear means "minus 4".
struct Q3_K {
    static constexpr tb::Size size = tb::size::Q3_K;
    static_assert(size.block_bytes == 32 + 64 + 12 + 2, "Q3_K layout");
    static void block(const uint8_t* b, float* y) {
        const uint8_t* hm = b;
        const uint8_t* qs = b + 32;
        const uint8_t* s = b + 96;
        const float d = half_at(b + 108);
        float dl[16];
        for (int i = 0; i < 16; ++i) {
            const int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
            const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            dl[i] = d * float(int8_t((lo | hi << 4) - 32));
        }
        for (int h = 0; h < 2; ++h)
            for (int s4 = 0; s4 < 4; ++s4)
                for (int l = 0; l < 32; ++l) {
                    const int v = 128 * h + 32 * s4 + l;
                    const int q = ((qs[32 * h + l] >> (2 * s4)) & 3) - 4 + 4 * ((hm[l] >> (4 * h + s4)) & 1);
                    y[v] = dl[v / 16] * float(q);
                }
    }
};

// The 6-bit (scale, min) pairs of Q4_K / Q5_K packed in 12 bytes (8 sub-blocks of 32 values).
inline void k4_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
}

// d:f16 | dmin:f16 | scales[12] | qs[128]: sub-block 2c (2c+1) is the low (high) nibbles of
// qs[32c..32c+32); value = d*sc * q - dmin*m
struct Q4_K {
    static constexpr tb::Size size = tb::size::Q4_K;
    static_assert(size.block_bytes == 2 + 2 + 12 + 128, "Q4_K layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b), dmin = half_at(b + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(b + 4, sc, mn);
        const uint8_t* qs = b + 16;
        for (int c = 0; c < 4; ++c)
            for (int hi = 0; hi < 2; ++hi) {
                const int j = 2 * c + hi;
                const float d1 = d * float(sc[j]), m1 = dmin * float(mn[j]);
                for (int l = 0; l < 32; ++l) y[32 * j + l] = d1 * float((qs[32 * c + l] >> (4 * hi)) & 15) - m1;
            }
    }
};

// d | dmin | scales[12] | qh[32] (bit j of qh[l] = 5th bit of value 32j+l) | qs[128] as Q4_K
struct Q5_K {
    static constexpr tb::Size size = tb::size::Q5_K;
    static_assert(size.block_bytes == 2 + 2 + 12 + 32 + 128, "Q5_K layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b), dmin = half_at(b + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(b + 4, sc, mn);
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + 48;
        for (int c = 0; c < 4; ++c)
            for (int hi = 0; hi < 2; ++hi) {
                const int j = 2 * c + hi;
                const float d1 = d * float(sc[j]), m1 = dmin * float(mn[j]);
                for (int l = 0; l < 32; ++l) {
                    const int q = ((qs[32 * c + l] >> (4 * hi)) & 15) | ((qh[l] >> j) & 1) << 4;
                    y[32 * j + l] = d1 * float(q) - m1;
                }
            }
    }
};

// ql[128] | qh[64] | scales:int8[16] (per 16 values) | d:f16. Value v = 128h + 32s + l:
// low nibble (s/2) of ql[64h + 32(s%2) + l], high bits 2s..2s+1 of qh[32h + l]; minus 32.
struct Q6_K {
    static constexpr tb::Size size = tb::size::Q6_K;
    static_assert(size.block_bytes == 128 + 64 + 16 + 2, "Q6_K layout");
    static void block(const uint8_t* b, float* y) {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = half_at(b + 208);
        for (int h = 0; h < 2; ++h)
            for (int s = 0; s < 4; ++s) {
                const int v0 = 128 * h + 32 * s;
                const float d0 = d * float(sc[v0 / 16]), d1 = d * float(sc[v0 / 16 + 1]);
                for (int l = 0; l < 32; ++l) {
                    const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                    const int q = (lo | ((qh[32 * h + l] >> (2 * s)) & 3) << 4) - 32;
                    y[v0 + l] = (l < 16 ? d0 : d1) * float(q);
                }
            }
    }
};

// d:f16 | qs[16] (nibbles as Q4_0) -> non-linear levels
struct IQ4_NL {
    static constexpr tb::Size size = tb::size::IQ4_NL;
    static_assert(size.block_bytes == 2 + 16, "IQ4_NL layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint8_t* qs = b + 2;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * float(tb::iq4nl_values[qs[j] & 15]);
            y[j + 16] = d * float(tb::iq4nl_values[qs[j] >> 4]);
        }
    }
};

// d:f16 | scales_h:u16 (2 bits per sub-block) | scales_l[4] (nibbles) | qs[128] (16 per
// sub-block of 32, nibbles as IQ4_NL); sub-block scale = d * (6-bit - 32)
struct IQ4_XS {
    static constexpr tb::Size size = tb::size::IQ4_XS;
    static_assert(size.block_bytes == 2 + 2 + 4 + 128, "IQ4_XS layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint16_t sh = rd16(b + 2);
        const uint8_t* sl = b + 4;
        const uint8_t* qs = b + 8;
        for (int j = 0; j < 8; ++j) {
            const int s = ((sl[j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4;
            const float dl = d * float(s - 32);
            for (int l = 0; l < 16; ++l) {
                y[32 * j + l] = dl * float(tb::iq4nl_values[qs[16 * j + l] & 15]);
                y[32 * j + l + 16] = dl * float(tb::iq4nl_values[qs[16 * j + l] >> 4]);
            }
        }
    }
};

// d:f16 | per sub-block of 32: u32 of 4 grid indices, u32 of 4x7 sign bits + 4-bit scale
struct IQ2_XXS {
    static constexpr tb::Size size = tb::size::IQ2_XXS;
    static_assert(size.block_bytes == 2 + 64, "IQ2_XXS layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        for (int ib = 0; ib < 8; ++ib) {
            const uint32_t a0 = rd32(b + 2 + 8 * ib), a1 = rd32(b + 6 + 8 * ib);
            const float db = d * (0.5f + float(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint8_t* g = tb::iq2xxs_grid[(a0 >> (8 * l)) & 255];
                const uint8_t signs = tb::ksigns[(a1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; ++j) y[32 * ib + 8 * l + j] = db * float(g[j]) * sign_of(signs, j);
            }
        }
    }
};

// d:f16 | qs:u16[32] (9-bit grid index, 7-bit sign index) | scales[8] (a nibble per 16 values)
struct IQ2_XS {
    static constexpr tb::Size size = tb::size::IQ2_XS;
    static_assert(size.block_bytes == 2 + 64 + 8, "IQ2_XS layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint8_t* sc = b + 66;
        for (int k = 0; k < 32; ++k) {
            const uint16_t q = rd16(b + 2 + 2 * k);
            const int nib = (sc[k / 4] >> (4 * ((k / 2) % 2))) & 15;
            const float db = d * (0.5f + float(nib)) * 0.25f;
            const uint8_t* g = tb::iq2xs_grid[q & 511];
            const uint8_t signs = tb::ksigns[q >> 9];
            for (int j = 0; j < 8; ++j) y[8 * k + j] = db * float(g[j]) * sign_of(signs, j);
        }
    }
};

// d:f16 | qs[64] (grid index per 4 values) | per sub-block of 32: u32 of 4x7 sign bits + scale
struct IQ3_XXS {
    static constexpr tb::Size size = tb::size::IQ3_XXS;
    static_assert(size.block_bytes == 2 + 64 + 32, "IQ3_XXS layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint8_t* qs = b + 2;
        for (int ib = 0; ib < 8; ++ib) {
            const uint32_t s = rd32(b + 66 + 4 * ib);
            const float db = d * (0.5f + float(s >> 28)) * 0.5f;
            for (int l = 0; l < 4; ++l) {
                const uint8_t signs = tb::ksigns[(s >> (7 * l)) & 127];
                const uint8_t* g0 = tb::iq3xxs_grid[qs[8 * ib + 2 * l]];
                const uint8_t* g1 = tb::iq3xxs_grid[qs[8 * ib + 2 * l + 1]];
                float* o = y + 32 * ib + 8 * l;
                for (int j = 0; j < 4; ++j) {
                    o[j] = db * float(g0[j]) * sign_of(signs, j);
                    o[j + 4] = db * float(g1[j]) * sign_of(signs, j + 4);
                }
            }
        }
    }
};

// d:f16 | qs[64] | qh[8] (9th index bit) | signs[32] (one bit per value) | scales[4] (nibbles)
struct IQ3_S {
    static constexpr tb::Size size = tb::size::IQ3_S;
    static_assert(size.block_bytes == 2 + 64 + 8 + 32 + 4, "IQ3_S layout");
    static void block(const uint8_t* b, float* y) {
        const float d = half_at(b);
        const uint8_t* qs = b + 2;
        const uint8_t* qh = b + 66;
        const uint8_t* sg = b + 74;
        const uint8_t* sc = b + 106;
        for (int ib = 0; ib < 8; ++ib) {
            const float db = d * float(1 + 2 * ((sc[ib / 2] >> (4 * (ib % 2))) & 15));
            for (int k = 0; k < 8; ++k) {
                const uint8_t* g = tb::iq3s_grid[qs[8 * ib + k] | ((qh[ib] >> k) & 1) << 8];
                for (int j = 0; j < 4; ++j) {
                    const int v = 32 * ib + 4 * k + j;
                    y[v] = db * float(g[j]) * sign_of(sg[v / 8], v % 8);
                }
            }
        }
    }
};

// e:e8m0 | qs[16] (nibbles as Q4_0) -> e2m1 values (doubled; the scale is halved to match)
struct MXFP4 {
    static constexpr tb::Size size = tb::size::MXFP4;
    static_assert(size.block_bytes == 1 + 16, "MXFP4 layout");
    static void block(const uint8_t* b, float* y) {
        const float d = e8m0_half(b[0]);
        const uint8_t* qs = b + 1;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * float(tb::mxfp4_values[qs[j] & 15]);
            y[j + 16] = d * float(tb::mxfp4_values[qs[j] >> 4]);
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Row functions built from a type's block decoder.

template <class K>
void to_float(const uint8_t* src, float* dst, int64_t n) {
    constexpr int B = K::size.block_values, S = K::size.block_bytes;
    for (int64_t i = 0; i < n / B; ++i) K::block(src + i * S, dst + i * B);
}

inline float sum_lanes(const float* acc, int lanes) {  // pairwise, for accuracy
    float a[16];
    std::memcpy(a, acc, sizeof(float) * lanes);
    for (int w = lanes / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; ++l) a[l] += a[l + w];
    return a[0];
}

template <class K>
float dot_portable(const uint8_t* row, const float* x, int64_t n) {
    constexpr int B = K::size.block_values, S = K::size.block_bytes, L = 16;
    float acc[L] = {};
    if constexpr (B == 1) {  // plain floats: 16 values per step, then the tail
        int64_t i = 0;
        for (; i + L <= n; i += L) {
            prefetch_block<L * S>(row + i * S);
            for (int l = 0; l < L; ++l) {
                float v;
                K::block(row + (i + l) * S, &v);
                acc[l] += v * x[i + l];
            }
        }
        for (; i < n; ++i) {
            float v;
            K::block(row + i * S, &v);
            acc[i % L] += v * x[i];
        }
    } else {
        static_assert(B % L == 0);
        alignas(64) float buf[B];
        for (int64_t ib = 0; ib < n / B; ++ib) {
            prefetch_block<S>(row + ib * S);
            K::block(row + ib * S, buf);
            const float* xb = x + ib * B;
            for (int j = 0; j < B; j += L)
                for (int l = 0; l < L; ++l) acc[l] += buf[j + l] * xb[j + l];
        }
    }
    return sum_lanes(acc, L);
}

// Several x vectors against one row: each block is decoded once into L1, then dotted with each
// token's slice of x by `fdot` (a float32 dot of B values: portable or AVX2). Below `min_m`
// tokens, m calls of the table's `dot` (which decodes in registers) are faster, so those go there.
template <int B>
float fdot_portable(const float* a, const float* b) {
    constexpr int L = 16;
    static_assert(B % L == 0);
    float acc[L] = {};
    for (int j = 0; j < B; j += L)
        for (int l = 0; l < L; ++l) acc[l] += a[j + l] * b[j + l];
    return sum_lanes(acc, L);
}

template <class K>
void dot_multi_decoded(const uint8_t* row, const float* x, int64_t ldx, int64_t m, int64_t n, float* out,
                       float (*fdot)(const float*, const float*)) {
    constexpr int B = K::size.block_values, S = K::size.block_bytes;
    alignas(64) float buf[B];
    for (int64_t t = 0; t < m; ++t) out[t] = 0.f;
    for (int64_t ib = 0; ib < n / B; ++ib) {
        prefetch_block<S>(row + ib * S);
        K::block(row + ib * S, buf);
        for (int64_t t = 0; t < m; ++t) out[t] += fdot(buf, x + t * ldx + ib * B);
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA kernels, compiled for x86-64 whatever the build's -march, used when the CPU has them.
#ifdef FTW_GGML_X86

// block scales in the SIMD kernels: the CPU's own half->float (exact for every non-NaN value;
// a NaN scale makes the dot NaN either way), no branches
FTW_AVX2 inline float half_hw(const uint8_t* p) { return _cvtsh_ss(rd16(p)); }

FTW_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 16 signed bytes . x[0..16) -> 8 lanes
FTW_AVX2 inline __m256 dot16_i8(__m128i q, const float* x) {
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
    return _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), _mm256_mul_ps(a, _mm256_loadu_ps(x)));
}

// 32 signed bytes . x[0..32) -> 8 lanes
FTW_AVX2 inline __m256 dot32_i8(__m256i q, const float* x) {
    return _mm256_add_ps(dot16_i8(_mm256_castsi256_si128(q), x),
                         dot16_i8(_mm256_extracti128_si256(q, 1), x + 16));
}

// 32 signed bytes in memory . x[0..32) -> 8 lanes: each 8 bytes widened straight from memory
// (vpmovsxbd ymm, m64) rather than extracted from a loaded register
FTW_AVX2 inline __m256 i8x8_mem(const int8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

FTW_AVX2 inline __m256 dot32_mem(const int8_t* q, const float* x) {
    const __m256 a = _mm256_fmadd_ps(i8x8_mem(q + 8), _mm256_loadu_ps(x + 8), _mm256_mul_ps(i8x8_mem(q), _mm256_loadu_ps(x)));
    const __m256 b = _mm256_fmadd_ps(i8x8_mem(q + 24), _mm256_loadu_ps(x + 24),
                                     _mm256_mul_ps(i8x8_mem(q + 16), _mm256_loadu_ps(x + 16)));
    return _mm256_add_ps(a, b);
}

FTW_AVX2 inline __m256 sum32(const float* x) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

// 16 bytes of nibbles (value j low, j+16 high) through a 16-entry int8 table, dotted with
// x[0..32) -> 8 lanes (each 16-value half stays in its own 128-bit register: no lane inserts)
FTW_AVX2 inline __m256 nibbles_lut_dot32(const uint8_t* qs, __m128i lut, const float* x) {
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(bytes, m4));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bytes, 4), m4));
    return _mm256_add_ps(dot16_i8(lo, x), dot16_i8(hi, x + 16));
}

inline __m128i load_lut(const int8_t* t) {  // plain SSE2 load, no target needed
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(t));
}

// F32 / F16 / BF16: 16 values a step, two FMA chains, then the tail
template <int S, __m256 (*Load8)(const uint8_t*), float (*One)(const uint8_t*)>
FTW_AVX2 float dot_float_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_block<16 * S>(row + i * S);
        a0 = _mm256_fmadd_ps(Load8(row + i * S), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(Load8(row + (i + 8) * S), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) s += One(row + i * S) * x[i];
    return s;
}

FTW_AVX2 inline __m256 load8_f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
FTW_AVX2 inline __m256 load8_f16(const uint8_t* p) {  // exact for every non-NaN half
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
FTW_AVX2 inline __m256 load8_bf16(const uint8_t* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
inline float one_f32(const uint8_t* p) { return bits_to_f32(rd32(p)); }
inline float one_bf16(const uint8_t* p) { return num::bf16_to_f32(rd16(p)); }

FTW_AVX2 float dot_f32_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_float_avx2<4, load8_f32, one_f32>(r, x, n);
}
FTW_AVX2 float dot_f16_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_float_avx2<2, load8_f16, half_at>(r, x, n);
}
FTW_AVX2 float dot_bf16_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_float_avx2<2, load8_bf16, one_bf16>(r, x, n);
}

FTW_AVX2 float dot_q8_0_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32) {
        const uint8_t* b = row + ib * Q8_0::size.block_bytes;
        prefetch_block<Q8_0::size.block_bytes>(b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b)), dot32_mem(reinterpret_cast<const int8_t*>(b + 2), x), acc);
    }
    return hsum(acc);
}

// Q4_0, IQ4_NL, MXFP4: 32 values = one scale x a 16-entry table of 4-bit codes
template <int S, float (*Scale)(const uint8_t*)>
FTW_AVX2 float dot_nibble_lut_avx2(const uint8_t* row, const float* x, int64_t n, __m128i lut) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t* b = row + ib * S;
        prefetch_block<S>(b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(Scale(b)), nibbles_lut_dot32(b + S - 16, lut, x + ib * 32), acc);
    }
    return hsum(acc);
}

FTW_AVX2 inline float scale_f16(const uint8_t* b) { return half_hw(b); }
inline float scale_e8m0(const uint8_t* b) { return e8m0_half(b[0]); }
constexpr int8_t q4_0_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

FTW_AVX2 float dot_q4_0_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_nibble_lut_avx2<Q4_0::size.block_bytes, scale_f16>(r, x, n, load_lut(q4_0_values));
}
FTW_AVX2 float dot_iq4_nl_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_nibble_lut_avx2<IQ4_NL::size.block_bytes, scale_f16>(r, x, n, load_lut(tb::iq4nl_values));
}
FTW_AVX2 float dot_mxfp4_avx2(const uint8_t* r, const float* x, int64_t n) {
    return dot_nibble_lut_avx2<MXFP4::size.block_bytes, scale_e8m0>(r, x, n, load_lut(tb::mxfp4_values));
}

FTW_AVX2 float dot_iq4_xs_avx2(const uint8_t* row, const float* x, int64_t n) {
    const __m128i lut = load_lut(tb::iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * IQ4_XS::size.block_bytes;
        prefetch_block<IQ4_XS::size.block_bytes>(b);
        const float d = half_hw(b);
        const uint16_t sh = rd16(b + 2);
        for (int j = 0; j < 8; ++j) {
            const int s = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * float(s - 32)), nibbles_lut_dot32(b + 8 + 16 * j, lut, x + 32 * j), acc);
        }
    }
    return hsum(acc);
}

// Q4_K / Q5_K: the 8 (d * scale) and (dmin * min) of a block as floats, unpacked with 32-bit
// masks and converted 8 at a time (the kernels then broadcast them from L1, a load-port op)
FTW_AVX2 inline void k4_scales(const uint8_t* b, float* dsc, float* dmn) {
    uint32_t u[3];
    std::memcpy(u, b + 4, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    const uint32_t sc_lo = u[0] & k1, sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    const uint32_t mn_lo = u[1] & k1, mn_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(sc_hi), int(sc_lo))));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(mn_hi), int(mn_lo))));
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(half_hw(b)), sc));
    _mm256_storeu_ps(dmn, _mm256_mul_ps(_mm256_set1_ps(half_hw(b + 2)), mn));
}

// sum_j d*sc_j * (q . x)_j - dmin*m_j * (sum x)_j over the 8 sub-blocks of 32. `xsum` (the
// 32-value sums of x, from dot_rows: computed once for every row) or nullptr (summed here).
FTW_AVX2 inline __m256 k_mins(const float* dmn, const float* x, const float* xsum, int64_t ib, __m256 accm) {
    if (xsum) return _mm256_fmadd_ps(_mm256_load_ps(dmn), _mm256_loadu_ps(xsum + 8 * ib), accm);
    for (int j = 0; j < 8; ++j) accm = _mm256_fmadd_ps(_mm256_broadcast_ss(dmn + j), sum32(x + 32 * j), accm);
    return accm;
}

FTW_AVX2 inline float q4_k_avx2(const uint8_t* row, const float* x, const float* xsum, int64_t n) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * Q4_K::size.block_bytes;
        prefetch_block<Q4_K::size.block_bytes>(b);
        alignas(32) float dsc[8], dmn[8];
        k4_scales(b, dsc, dmn);
        for (int c = 0; c < 4; ++c) {
            const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
            const __m256i lo = _mm256_and_si256(bytes, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
            const float* x0 = x + 64 * c;
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + 2 * c), dot32_i8(lo, x0), acc);
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + 2 * c + 1), dot32_i8(hi, x0 + 32), acc);
        }
        accm = k_mins(dmn, x, xsum, ib, accm);
    }
    return hsum(_mm256_sub_ps(acc, accm));
}

FTW_AVX2 inline float q5_k_avx2(const uint8_t* row, const float* x, const float* xsum, int64_t n) {
    const __m256i m4 = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * Q5_K::size.block_bytes;
        prefetch_block<Q5_K::size.block_bytes>(b);
        alignas(32) float dsc[8], dmn[8];
        k4_scales(b, dsc, dmn);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        for (int c = 0; c < 4; ++c) {
            const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
            // bit j of qh[l] -> 16 for sub-block j: shift the wanted bit to bit 4 (16-bit lanes
            // shift bits across bytes, the mask keeps only bit 4 of each byte)
            const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), bit4);
            const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), bit4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bytes, m4), h0);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4), h1);
            const float* x0 = x + 64 * c;
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + 2 * c), dot32_i8(lo, x0), acc);
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + 2 * c + 1), dot32_i8(hi, x0 + 32), acc);
        }
        accm = k_mins(dmn, x, xsum, ib, accm);
    }
    return hsum(_mm256_sub_ps(acc, accm));
}

FTW_AVX2 float dot_q4_k_avx2(const uint8_t* r, const float* x, int64_t n) { return q4_k_avx2(r, x, nullptr, n); }
FTW_AVX2 float dot_q5_k_avx2(const uint8_t* r, const float* x, int64_t n) { return q5_k_avx2(r, x, nullptr, n); }

// dot_rows for the K-quants with mins: the G-value sums of x once, then every row
template <int G, float (*Core)(const uint8_t*, const float*, const float*, int64_t)>
FTW_AVX2 void rows_with_xsum(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out) {
    constexpr int64_t kStack = 1024;  // rows up to 16384 values keep the sums on the stack
    alignas(32) float stack[kStack];
    std::vector<float> heap(n / G > kStack ? size_t(n / G) : 0);
    float* xsum = heap.empty() ? stack : heap.data();
    for (int64_t j = 0; j < n / G; ++j) {
        __m256 v = _mm256_loadu_ps(x + G * j);
        for (int k = 8; k < G; k += 8) v = _mm256_add_ps(v, _mm256_loadu_ps(x + G * j + k));
        xsum[j] = hsum(v);
    }
    for (int64_t r = 0; r < R; ++r) out[r] = Core(rows + r * stride, x, xsum, n);
}

FTW_AVX2 void rows_q4_k_avx2(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out) {
    rows_with_xsum<32, q4_k_avx2>(rows, stride, R, x, n, out);
}
FTW_AVX2 void rows_q5_k_avx2(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out) {
    rows_with_xsum<32, q5_k_avx2>(rows, stride, R, x, n, out);
}

// Q6_K: the 16 (d * scale) of a block as floats, converted 8 at a time
FTW_AVX2 inline void q6k_scales(const uint8_t* b, float* dsc) {
    const __m256 d = _mm256_set1_ps(half_hw(b + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    _mm256_storeu_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(dsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

FTW_AVX2 float dot_q6_k_avx2(const uint8_t* row, const float* x, int64_t n) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * Q6_K::size.block_bytes;
        prefetch_block<Q6_K::size.block_bytes>(b);
        alignas(32) float dsc[16];
        q6k_scales(b, dsc);
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
            const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                                     _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            for (int s = 0; s < 4; ++s) {
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[s], _mm256_slli_epi16(high, 4)), off);
                const float* xs = x + 128 * h + 32 * s;
                const int k = 8 * h + 2 * s;
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k), dot16_i8(_mm256_castsi256_si128(q), xs), acc);
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k + 1),
                                      dot16_i8(_mm256_extracti128_si256(q, 1), xs + 16), acc);
            }
        }
    }
    return hsum(acc);
}

// 16 bytes of nibbles -> 32 bytes (values 0..15 the low nibbles, 16..31 the high ones)
FTW_AVX2 inline __m256i nibbles(const uint8_t* qs) {
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), m4), _mm_and_si128(bytes, m4));
}

// bit j of `bits` -> byte j = 0x10 (Q5_0/Q5_1's fifth bit), else 0
FTW_AVX2 inline __m256i fifth_bits(uint32_t bits) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), spread), mask);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, mask), _mm256_set1_epi8(16));
}

FTW_AVX2 inline __m256 sum16(const float* x) { return _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)); }

// Q4_1 / Q5_1: d * (q . x) + m * sum(x)
FTW_AVX2 float dot_q4_1_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32) {
        const uint8_t* b = row + ib * Q4_1::size.block_bytes;
        prefetch_block<Q4_1::size.block_bytes>(b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b)), dot32_i8(nibbles(b + 4), x), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b + 2)), sum32(x), accm);
    }
    return hsum(_mm256_add_ps(acc, accm));
}

FTW_AVX2 float dot_q5_1_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32) {
        const uint8_t* b = row + ib * Q5_1::size.block_bytes;
        prefetch_block<Q5_1::size.block_bytes>(b);
        const __m256i q = _mm256_or_si256(nibbles(b + 8), fifth_bits(rd32(b + 4)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b)), dot32_i8(q, x), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b + 2)), sum32(x), accm);
    }
    return hsum(_mm256_add_ps(acc, accm));
}

FTW_AVX2 float dot_q5_0_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i off = _mm256_set1_epi8(16);
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32) {
        const uint8_t* b = row + ib * Q5_0::size.block_bytes;
        prefetch_block<Q5_0::size.block_bytes>(b);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(rd32(b + 2))), off);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_hw(b)), dot32_i8(q, x), acc);
    }
    return hsum(acc);
}

// Q2_K: the 16 (d * scale) and (dmin * min) of a block as floats (low / high nibbles)
FTW_AVX2 inline void q2k_scales(const uint8_t* b, float* dsc, float* dmn) {
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i lo = _mm_and_si128(sc, m4), hi = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
    const __m256 d = _mm256_set1_ps(half_hw(b + 80)), dmin = _mm256_set1_ps(half_hw(b + 82));
    _mm256_store_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))));
    _mm256_store_ps(dsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_store_ps(dmn, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))));
    _mm256_store_ps(dmn + 8, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))));
}

// Q2_K: per 16 values d*(sc&15) * (q . x) - dmin*(sc>>4) * sum(x); `xsum` as for Q4_K, per 16
FTW_AVX2 inline float q2_k_avx2(const uint8_t* row, const float* x, const float* xsum, int64_t n) {
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * Q2_K::size.block_bytes;
        prefetch_block<Q2_K::size.block_bytes>(b);
        alignas(32) float dsc[16], dmn[16];
        q2k_scales(b, dsc, dmn);
        for (int h = 0; h < 2; ++h) {
            const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * h));
            for (int s = 0; s < 4; ++s) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m2);
                const int k = 8 * h + 2 * s;
                const float* xs = x + 16 * k;
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k), dot16_i8(_mm256_castsi256_si128(q), xs), acc);
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k + 1), dot16_i8(_mm256_extracti128_si256(q, 1), xs + 16), acc);
            }
        }
        if (xsum) {
            accm = _mm256_fmadd_ps(_mm256_load_ps(dmn), _mm256_loadu_ps(xsum + 16 * ib), accm);
            accm = _mm256_fmadd_ps(_mm256_load_ps(dmn + 8), _mm256_loadu_ps(xsum + 16 * ib + 8), accm);
        } else {
            for (int k = 0; k < 16; ++k) accm = _mm256_fmadd_ps(_mm256_broadcast_ss(dmn + k), sum16(x + 16 * k), accm);
        }
    }
    return hsum(_mm256_sub_ps(acc, accm));
}

FTW_AVX2 float dot_q2_k_avx2(const uint8_t* r, const float* x, int64_t n) { return q2_k_avx2(r, x, nullptr, n); }
FTW_AVX2 void rows_q2_k_avx2(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out) {
    rows_with_xsum<16, q2_k_avx2>(rows, stride, R, x, n, out);
}

// Q3_K: the 16 (d * (scale - 32)) of a block as floats; the 6-bit scales unpacked with 32-bit
// masks (low nibbles from bytes 0-7, high 2 bits from bytes 8-11)
FTW_AVX2 inline void q3k_scales(const uint8_t* b, float* dsc) {
    uint32_t a[3], u[4];
    std::memcpy(a, b + 96, 12);
    const uint32_t k2 = 0x0f0f0f0f, k1 = 0x03030303;
    u[0] = (a[0] & k2) | (((a[2] >> 0) & k1) << 4);
    u[1] = (a[1] & k2) | (((a[2] >> 2) & k1) << 4);
    u[2] = ((a[0] >> 4) & k2) | (((a[2] >> 4) & k1) << 4);
    u[3] = ((a[1] >> 4) & k2) | (((a[2] >> 6) & k1) << 4);
    __m128i sc;
    std::memcpy(&sc, u, 16);
    sc = _mm_sub_epi8(sc, _mm_set1_epi8(32));
    const __m256 d = _mm256_set1_ps(half_hw(b + 108));
    _mm256_store_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(dsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

FTW_AVX2 float dot_q3_k_avx2(const uint8_t* row, const float* x, int64_t n) {
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib, x += 256) {
        const uint8_t* b = row + ib * Q3_K::size.block_bytes;
        prefetch_block<Q3_K::size.block_bytes>(b);
        alignas(32) float dsc[16];
        q3k_scales(b, dsc);
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
        for (int h = 0; h < 2; ++h) {
            const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * h));
            for (int sh = 0; sh < 4; ++sh) {
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * sh), m2);
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + sh), one);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), four);
                const int k = 8 * h + 2 * sh;
                const float* xs = x + 16 * k;
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k), dot16_i8(_mm256_castsi256_si128(q), xs), acc);
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(dsc + k + 1), dot16_i8(_mm256_extracti128_si256(q, 1), xs + 16), acc);
            }
        }
    }
    return hsum(acc);
}

// A sign byte (bit j set: value j negative) -> 8 float sign-bit masks, one 32-byte row per byte
// value (8 KiB, computed at compile time): one load and one xor per 8 values in the IQ kernels
struct SignMasks {
    alignas(32) uint32_t m[256][8];
};

constexpr SignMasks make_sign_masks() {
    SignMasks t{};
    for (int s = 0; s < 256; ++s)
        for (int j = 0; j < 8; ++j) t.m[s][j] = (s >> j) & 1 ? 0x80000000u : 0u;
    return t;
}

constexpr SignMasks kSignMasks = make_sign_masks();

// 8 grid magnitudes (bytes) -> floats with the signs of `signs`
FTW_AVX2 inline __m256 signed_grid8(uint64_t g8, uint8_t signs) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(g8))));
    return _mm256_xor_ps(v, _mm256_load_ps(reinterpret_cast<const float*>(kSignMasks.m[signs])));
}

inline uint64_t grid8(const uint8_t* g) {
    uint64_t v;
    std::memcpy(&v, g, 8);
    return v;
}

inline uint64_t grid4x2(const uint8_t* g0, const uint8_t* g1) { return uint64_t(rd32(g0)) | uint64_t(rd32(g1)) << 32; }

FTW_AVX2 float dot_iq2_xxs_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib) {
        const uint8_t* b = row + ib * IQ2_XXS::size.block_bytes;
        prefetch_block<IQ2_XXS::size.block_bytes>(b);
        const float d = half_hw(b);
        for (int j = 0; j < 8; ++j, x += 32) {
            const uint32_t a0 = rd32(b + 2 + 8 * j), a1 = rd32(b + 6 + 8 * j);
            __m256 s = _mm256_setzero_ps();
            for (int l = 0; l < 4; ++l) {
                const __m256 w = signed_grid8(grid8(tb::iq2xxs_grid[(a0 >> (8 * l)) & 255]), tb::ksigns[(a1 >> (7 * l)) & 127]);
                s = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8 * l), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (0.5f + float(a1 >> 28)) * 0.25f), s, acc);
        }
    }
    return hsum(acc);
}

FTW_AVX2 float dot_iq2_xs_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib) {
        const uint8_t* b = row + ib * IQ2_XS::size.block_bytes;
        prefetch_block<IQ2_XS::size.block_bytes>(b);
        const float d = half_hw(b);
        for (int k = 0; k < 32; k += 2, x += 16) {  // two grid rows share a scale nibble
            const uint16_t q0 = rd16(b + 2 + 2 * k), q1 = rd16(b + 4 + 2 * k);
            const __m256 w0 = signed_grid8(grid8(tb::iq2xs_grid[q0 & 511]), tb::ksigns[q0 >> 9]);
            const __m256 w1 = signed_grid8(grid8(tb::iq2xs_grid[q1 & 511]), tb::ksigns[q1 >> 9]);
            const __m256 s = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(w0, _mm256_loadu_ps(x)));
            const int nib = (b[66 + k / 4] >> (4 * ((k / 2) % 2))) & 15;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (0.5f + float(nib)) * 0.25f), s, acc);
        }
    }
    return hsum(acc);
}

FTW_AVX2 float dot_iq3_xxs_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib) {
        const uint8_t* b = row + ib * IQ3_XXS::size.block_bytes;
        prefetch_block<IQ3_XXS::size.block_bytes>(b);
        const float d = half_hw(b);
        const uint8_t* qs = b + 2;
        for (int j = 0; j < 8; ++j, x += 32) {
            const uint32_t s32 = rd32(b + 66 + 4 * j);
            __m256 s = _mm256_setzero_ps();
            for (int l = 0; l < 4; ++l) {
                const uint64_t g = grid4x2(tb::iq3xxs_grid[qs[8 * j + 2 * l]], tb::iq3xxs_grid[qs[8 * j + 2 * l + 1]]);
                s = _mm256_fmadd_ps(signed_grid8(g, tb::ksigns[(s32 >> (7 * l)) & 127]), _mm256_loadu_ps(x + 8 * l), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (0.5f + float(s32 >> 28)) * 0.5f), s, acc);
        }
    }
    return hsum(acc);
}

FTW_AVX2 float dot_iq3_s_avx2(const uint8_t* row, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 256; ++ib) {
        const uint8_t* b = row + ib * IQ3_S::size.block_bytes;
        prefetch_block<IQ3_S::size.block_bytes>(b);
        const float d = half_hw(b);
        const uint8_t *qs = b + 2, *qh = b + 66, *sg = b + 74, *sc = b + 106;
        for (int j = 0; j < 8; ++j, x += 32) {
            __m256 s = _mm256_setzero_ps();
            for (int l = 0; l < 4; ++l) {  // 8 values: grid rows 2l and 2l+1 of sub-block j
                const int k = 2 * l;
                const uint8_t* g0 = tb::iq3s_grid[qs[8 * j + k] | ((qh[j] >> k) & 1) << 8];
                const uint8_t* g1 = tb::iq3s_grid[qs[8 * j + k + 1] | ((qh[j] >> (k + 1)) & 1) << 8];
                s = _mm256_fmadd_ps(signed_grid8(grid4x2(g0, g1), sg[4 * j + l]), _mm256_loadu_ps(x + 8 * l), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * float(1 + 2 * ((sc[j / 2] >> (4 * (j % 2))) & 15))), s, acc);
        }
    }
    return hsum(acc);
}

// float32 dot of B values (a decoded block against x), four independent FMA chains
template <int B>
FTW_AVX2 float fdot_avx2(const float* a, const float* b) {
    static_assert(B % 32 == 0);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (int j = 0; j < B; j += 32) {
        s0 = _mm256_fmadd_ps(_mm256_load_ps(a + j), _mm256_loadu_ps(b + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_load_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_load_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_load_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), s3);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

bool cpu_has_avx2() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#endif  // FTW_GGML_X86

using DotFn = float (*)(const uint8_t*, const float*, int64_t);

// The one table. `avx2` is the type's SIMD kernel, nullptr where it has none. (AVX-512 versions
// of the Q8_0/Q4_K/Q6_K kernels were measured no faster on a Sapphire Rapids core: these
// kernels are bound by uops per value, not vector width.)
using RowsFn = void (*)(const uint8_t*, int64_t, int64_t, const float*, int64_t, float*);

struct Entry {
    TypeTraits traits;
    DotFn avx2;
    RowsFn avx2_rows;  // a dot_rows that shares work across rows, or nullptr (rows one by one)
};

template <class K>
void dot_multi(const uint8_t* row, const float* x, int64_t ldx, int64_t m, int64_t n, float* out);
template <class K>
void dot_rows(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out);

template <class K>
constexpr Entry entry(const char* name, DotFn avx2 = nullptr, RowsFn avx2_rows = nullptr) {
    return {{name, K::size.id, K::size.block_values, K::size.block_bytes, &to_float<K>,
             &dot_portable<K>, &dot_portable<K>, &dot_multi<K>, &dot_rows<K>},
            avx2, avx2_rows};
}

#ifdef FTW_GGML_X86
#define FTW_SIMD(fn) fn
#else
#define FTW_SIMD(fn) nullptr
#endif

Entry g_entries[] = {
    entry<F32>("F32", FTW_SIMD(dot_f32_avx2)),
    entry<F16>("F16", FTW_SIMD(dot_f16_avx2)),
    entry<BF16>("BF16", FTW_SIMD(dot_bf16_avx2)),
    entry<Q8_0>("Q8_0", FTW_SIMD(dot_q8_0_avx2)),
    entry<Q4_0>("Q4_0", FTW_SIMD(dot_q4_0_avx2)),
    entry<Q4_1>("Q4_1", FTW_SIMD(dot_q4_1_avx2)),
    entry<Q5_0>("Q5_0", FTW_SIMD(dot_q5_0_avx2)),
    entry<Q5_1>("Q5_1", FTW_SIMD(dot_q5_1_avx2)),
    entry<Q2_K>("Q2_K", FTW_SIMD(dot_q2_k_avx2), FTW_SIMD(rows_q2_k_avx2)),
    entry<Q3_K>("Q3_K", FTW_SIMD(dot_q3_k_avx2)),
    entry<Q4_K>("Q4_K", FTW_SIMD(dot_q4_k_avx2), FTW_SIMD(rows_q4_k_avx2)),
    entry<Q5_K>("Q5_K", FTW_SIMD(dot_q5_k_avx2), FTW_SIMD(rows_q5_k_avx2)),
    entry<Q6_K>("Q6_K", FTW_SIMD(dot_q6_k_avx2)),
    entry<IQ4_NL>("IQ4_NL", FTW_SIMD(dot_iq4_nl_avx2)),
    entry<IQ4_XS>("IQ4_XS", FTW_SIMD(dot_iq4_xs_avx2)),
    entry<IQ2_XXS>("IQ2_XXS", FTW_SIMD(dot_iq2_xxs_avx2)),
    entry<IQ2_XS>("IQ2_XS", FTW_SIMD(dot_iq2_xs_avx2)),
    entry<IQ3_XXS>("IQ3_XXS", FTW_SIMD(dot_iq3_xxs_avx2)),
    entry<IQ3_S>("IQ3_S", FTW_SIMD(dot_iq3_s_avx2)),
    entry<MXFP4>("MXFP4", FTW_SIMD(dot_mxfp4_avx2)),
};

// Picks the kernels once, at first use (static initialisation order does not matter): AVX2
// where the CPU has it, unless the environment variable FTW_GGML_SIMD=portable asks for the
// portable kernels (how the tests cover them on an AVX2 machine).
enum Level { kPortable = 0, kAvx2 = 1 };
constexpr const char* kLevelNames[] = {"portable", "avx2"};

struct Table {
    Level level = kPortable;
    Table() {
#ifdef FTW_GGML_X86
        const char* cap = std::getenv("FTW_GGML_SIMD");
        if (cpu_has_avx2() && !(cap && std::string_view(cap) == "portable")) level = kAvx2;
#endif
        for (Entry& e : g_entries) {
            if (level >= kAvx2 && e.avx2) e.traits.dot = e.avx2;
            if (level >= kAvx2 && e.avx2_rows) e.traits.dot_rows = e.avx2_rows;
        }
    }
};

const Table& table() {
    static const Table t;
    return t;
}

template <class K>
const TypeTraits& traits_of() {
    static const TypeTraits* t = find(K::size.id);
    return *t;
}

template <class K>
void dot_rows(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out) {
    const TypeTraits& t = traits_of<K>();
    for (int64_t r = 0; r < R; ++r) out[r] = t.dot(rows + r * stride, x, n);
}

template <class K>
void dot_multi(const uint8_t* row, const float* x, int64_t ldx, int64_t m, int64_t n, float* out) {
    const TypeTraits& t = traits_of<K>();
    // Measured (one core, 2048-value rows): a SIMD dot that decodes in registers beats
    // decode-once below ~8 tokens for 256-value blocks (1.4-1.7x faster from 8-32 tokens) and
    // always for 32-value blocks, whose blocks are too short to pay for the extra pass.
    constexpr int B = K::size.block_values;
    const bool simd = t.dot != t.dot_portable;
    const int64_t min_m = B == 1 || (simd && B < 256) ? INT64_MAX : simd ? 8 : 2;
    if (m < min_m) {
        for (int64_t i = 0; i < m; ++i) out[i] = t.dot(row, x + i * ldx, n);
        return;
    }
    if constexpr (B > 1) {
#ifdef FTW_GGML_X86
        if (table().level >= kAvx2) return dot_multi_decoded<K>(row, x, ldx, m, n, out, &fdot_avx2<B>);
#endif
        dot_multi_decoded<K>(row, x, ldx, m, n, out, &fdot_portable<B>);
    }
}

}  // namespace

const TypeTraits* find(std::string_view name) {
    table();
    for (const Entry& e : g_entries)
        if (name == e.traits.name) return &e.traits;
    return nullptr;
}

const TypeTraits* find(int type_id) {
    table();
    for (const Entry& e : g_entries)
        if (type_id == e.traits.type_id) return &e.traits;
    return nullptr;
}

std::vector<const TypeTraits*> all() {
    table();
    std::vector<const TypeTraits*> out;
    for (const Entry& e : g_entries) out.push_back(&e.traits);
    return out;
}

const TypeTraits& lookup(std::string_view name) {
    if (const TypeTraits* t = find(name)) return *t;
    std::string known;
    for (const Entry& e : g_entries) known += (known.empty() ? "" : ", ") + std::string(e.traits.name);
    throw UnsupportedError("ggml type '" + std::string(name) + "' is not supported by ftw's runtime (supported: " +
                           known + ")");
}

void check_row(const TypeTraits& t, int64_t n, int64_t nbytes, std::string_view what) {
    if (n <= 0 || n % t.block_values != 0)
        throw FormatError(std::string(what) + ": " + std::to_string(n) + " values of " + t.name +
                          " is not a positive multiple of its block size " + std::to_string(t.block_values));
    if (t.row_bytes(n) != nbytes)
        throw FormatError(std::string(what) + ": " + std::to_string(n) + " values of " + t.name + " take " +
                          std::to_string(t.row_bytes(n)) + " bytes, got " + std::to_string(nbytes));
}

const char* simd_level() { return kLevelNames[table().level]; }

}  // namespace ftw::ggml
