// Vector decoders for the codes the formats store, one block of 16 values at a time, and the
// float dot product: AVX-512 where the compiler targets it (-march=native on such a CPU),
// AVX2 + F16C next, and a portable scalar path always (FTW_NATIVE=OFF builds, other CPUs).
// The codes are exact in float32 and a scale multiplies once per value in every path, so the
// paths agree bit for bit, except where a vector path fuses a multiply-add (affine's q * scale
// + offset), which differs by float32 rounding.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FTW_SIMD_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define FTW_SIMD_AVX2 1
#include <immintrin.h>
#endif

#include "core/numerics.h"

namespace ftw::simd {

inline const char* path() {
#if defined(FTW_SIMD_AVX512)
    return "avx512";
#elif defined(FTW_SIMD_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

// sum a[i] * b[i], float32, several independent accumulators
inline float dot(const float* a, const float* b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if defined(FTW_SIMD_AVX512)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(FTW_SIMD_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    s = _mm_cvtss_f32(q);
#else
    constexpr int L = 16;
    float acc[L] = {};
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; ++j) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; j < L; ++j) s += acc[j];
#endif
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// out[j] += sum_i a[i] * x[j * ldx + i] for j < 4: four tokens against one decoded chunk, each
// value of `a` loaded once for the four
inline void dot4(const float* a, const float* x, int64_t ldx, int64_t n, float* out) {
#if defined(FTW_SIMD_AVX512)
    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(), c3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 w = _mm512_loadu_ps(a + i);
        c0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i), c0);
        c1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + ldx + i), c1);
        c2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + 2 * ldx + i), c2);
        c3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + 3 * ldx + i), c3);
    }
    float s[4] = {_mm512_reduce_add_ps(c0), _mm512_reduce_add_ps(c1), _mm512_reduce_add_ps(c2), _mm512_reduce_add_ps(c3)};
    for (; i < n; ++i)
        for (int j = 0; j < 4; ++j) s[j] += a[i] * x[j * ldx + i];
    for (int j = 0; j < 4; ++j) out[j] += s[j];
#else
    for (int j = 0; j < 4; ++j) out[j] += dot(a, x + j * ldx, n);
#endif
}

// 16 bf16 -> float
inline void bf16x16(const uint16_t* w, float* out) {
#if defined(FTW_SIMD_AVX512)
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    _mm512_storeu_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
#elif defined(FTW_SIMD_AVX2)
    for (int h = 0; h < 2; ++h) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8 * h)));
        _mm256_storeu_ps(out + 8 * h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
#else
    for (int i = 0; i < 16; ++i) out[i] = num::bf16_to_f32(w[i]);
#endif
}

// 16 e4m3fn bytes -> float * scale. The vector paths place the code in a half float (the
// e4m3 value is the half's value times 2^8, subnormals included) and convert with F16C.
inline void e4m3x16(const uint8_t* w, float scale, float* out) {
#if defined(FTW_SIMD_AVX512)
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7));
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(scale * 256.0f)));
#elif defined(FTW_SIMD_AVX2)
    for (int half = 0; half < 2; ++half) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 8 * half)));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
        _mm256_storeu_ps(out + 8 * half, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale * 256.0f)));
    }
#else
    for (int i = 0; i < 16; ++i) out[i] = num::kE4M3[w[i]] * scale;
#endif
}

// n E8M0 bytes -> 2^(b - 127) (255: NaN), as float bit patterns: b << 23 for 1..254, the
// denormal 2^-127 for 0. Written so the compiler vectorizes it.
inline void e8m0_to_f32(const uint8_t* b, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t v = b[i];
        const uint32_t u = v == 0 ? 0x00400000u : v == 255 ? 0x7FC00000u : v << 23;
        std::memcpy(out + i, &u, 4);
    }
}

// n e4m3fn bytes -> value * mul (n a multiple of 16 goes 16 at a time)
inline void e4m3_to_f32(const uint8_t* b, int64_t n, float mul, float* out);

// 8 bytes of e2m1 pairs (low nibble first) -> 16 floats * scale
inline void e2m1x16(const uint8_t* w, float scale, float* out) {
#if defined(FTW_SIMD_AVX512)
    const __m512 lut = _mm512_mul_ps(_mm512_loadu_ps(num::kE2M1.data()), _mm512_set1_ps(scale));
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nib), lut));
#elif defined(FTW_SIMD_AVX2)
    // magnitude from an 8-entry table, sign from bit 3
    const __m256 lut = _mm256_mul_ps(_mm256_loadu_ps(num::kE2M1.data()), _mm256_set1_ps(scale));
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    for (int half = 0; half < 2; ++half) {
        __m256i idx = _mm256_cvtepu8_epi32(half ? _mm_srli_si128(nib, 8) : nib);
        __m256 mag = _mm256_permutevar8x32_ps(lut, _mm256_and_si256(idx, _mm256_set1_epi32(7)));
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
        _mm256_storeu_ps(out + 8 * half, _mm256_xor_ps(mag, _mm256_castsi256_ps(sign)));
    }
#else
    for (int j = 0; j < 8; ++j) {
        out[2 * j] = num::kE2M1[w[j] & 0xF] * scale;
        out[2 * j + 1] = num::kE2M1[w[j] >> 4] * scale;
    }
#endif
}

inline void e4m3_to_f32(const uint8_t* b, int64_t n, float mul, float* out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) e4m3x16(b + i, mul, out + i);
    for (; i < n; ++i) out[i] = num::kE4M3[b[i]] * mul;
}

// 8 bytes of 4-bit unsigned values (low nibble first) -> 16 floats q * scale + offset
inline void u4x16(const uint8_t* w, float scale, float offset, float* out) {
#if defined(FTW_SIMD_AVX512)
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(q, _mm512_set1_ps(scale), _mm512_set1_ps(offset)));
#elif defined(FTW_SIMD_AVX2)
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    for (int half = 0; half < 2; ++half) {
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half ? _mm_srli_si128(nib, 8) : nib));
        _mm256_storeu_ps(out + 8 * half, _mm256_fmadd_ps(q, _mm256_set1_ps(scale), _mm256_set1_ps(offset)));
    }
#else
    for (int j = 0; j < 8; ++j) {
        out[2 * j] = float(w[j] & 0xF) * scale + offset;
        out[2 * j + 1] = float(w[j] >> 4) * scale + offset;
    }
#endif
}

// Weight rows of a bank follow each other in memory, so reading ahead in the same stream
// fetches the next rows; the hardware prefetchers alone leave a decode step at a fraction of
// the memory bandwidth (they restart at every 4 KiB page and every new task).
inline constexpr int64_t kPrefetchBytes = 2048;

inline void prefetch(const void* p) {
#if defined(FTW_SIMD_AVX512) || defined(FTW_SIMD_AVX2)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#elif defined(__GNUC__)
    __builtin_prefetch(p);
#endif
}

// Fused decode + dot for one token (decode, T = 1): sum_i value(w)[i] * scale[i / block] * x[i]
// over n values, never writing the decoded values anywhere. `scale` holds one float per block.

// The input vector in the order dot_e2m1 reads it. With AVX-512 a 16-byte load holds 32
// values whose low nibbles are the even elements and high nibbles the odd ones: decoding the
// two halves separately and reading x as [evens, odds] per 32 saves the re-interleave. Done once
// per token and projection, shared by all rows. n a multiple of 16; a last 16 stay in order.
inline void e2m1_order_x(const float* x, int64_t n, float* out) {
    int64_t i = 0;
#if defined(FTW_SIMD_AVX512)
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 16; ++j) {
            out[i + j] = x[i + 2 * j];
            out[i + 16 + j] = x[i + 2 * j + 1];
        }
#endif
    std::memcpy(out + i, x + i, size_t(n - i) * sizeof(float));
}

// e2m1 pairs (low nibble first) . x (x as e2m1_order_x left it); block 16 or 32, n a multiple
// of block
inline float dot_e2m1(const uint8_t* w, const float* scale, int64_t block, const float* x, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(FTW_SIMD_AVX512)
    const __m512 lut = _mm512_loadu_ps(num::kE2M1.data());
    const __m512i m = _mm512_set1_epi32(0x0F);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        if ((i & 127) == 0) prefetch(w + i / 2 + kPrefetchBytes);
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i / 2)));
        const __m512 even = _mm512_permutexvar_ps(_mm512_and_si512(b, m), lut);  // elements i, i+2, ...
        const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);  // elements i+1, i+3, ...
        // lanes 0-7 hold elements i..i+15, lanes 8-15 elements i+16..i+31
        const __m512 s = block == 32 ? _mm512_set1_ps(scale[i >> 5])
                                     : _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(scale[i >> 4]), _mm512_set1_ps(scale[(i >> 4) + 1]));
        const __m512 t = _mm512_fmadd_ps(even, _mm512_loadu_ps(x + i), _mm512_mul_ps(odd, _mm512_loadu_ps(x + i + 16)));
        if (i & 32) acc1 = _mm512_fmadd_ps(t, s, acc1);
        else acc0 = _mm512_fmadd_ps(t, s, acc0);
    }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
    alignas(64) float buf[16];
    for (; i < n; i += 16) {
        if ((i & 127) == 0) prefetch(w + i / 2 + kPrefetchBytes);
        e2m1x16(w + i / 2, scale[block == 32 ? i >> 5 : i >> 4], buf);
        sum += dot(buf, x + i, 16);
    }
    return sum;
}

// 4-bit unsigned values (low nibble first) with a scale and an offset per group (MLX affine):
// sum_i (q_i s_g + o_g) x_i = sum_g s_g (q . x)_g + o_g xsum_g. x as e2m1_order_x left it, xsum
// the per-group sums of x; group a multiple of 32, n a multiple of group.
inline float dot_u4_affine(const uint8_t* w, const float* s, const float* o, int64_t group, const float* x,
                           const float* xsum, int64_t n) {
    float off = 0.0f;
    for (int64_t g = 0; g < n / group; ++g) off += o[g] * xsum[g];
#if defined(FTW_SIMD_AVX512)
    const __m512i m = _mm512_set1_epi32(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < n; g0 += group) {
        __m512 ga = _mm512_setzero_ps();
        for (int64_t i = g0; i < g0 + group; i += 32) {
            if ((i & 127) == 0) prefetch(w + i / 2 + kPrefetchBytes);
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i / 2)));
            ga = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, m)), _mm512_loadu_ps(x + i), ga);
            ga = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), _mm512_loadu_ps(x + i + 16), ga);
        }
        acc = _mm512_fmadd_ps(ga, _mm512_set1_ps(s[g0 / group]), acc);
    }
    return _mm512_reduce_add_ps(acc) + off;
#else
    alignas(64) float buf[16];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += 16) {
        if ((i & 127) == 0) prefetch(w + i / 2 + kPrefetchBytes);
        u4x16(w + i / 2, 1.0f, 0.0f, buf);
        sum += s[i / group] * dot(buf, x + i, 16);
    }
    return sum + off;
#endif
}

// e4m3fn bytes . x; block a multiple of 16, n a multiple of 16. Steps block by block (one
// scale each), so no division in the loop.
inline float dot_e4m3(const uint8_t* w, const float* scale, int64_t block, const float* x, int64_t n) {
    float sum = 0.0f;
#if defined(FTW_SIMD_AVX512)
    const __m256i m80 = _mm256_set1_epi16(0x80), m7f = _mm256_set1_epi16(0x7F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t b1 = b0 + block < n ? b0 + block : n;
        const __m512 s = _mm512_set1_ps(scale[b0 / block] * 256.0f);
        __m512 t = _mm512_setzero_ps();
        for (int64_t i = b0; i < b1; i += 16) {
            if ((i & 63) == 0) prefetch(w + i + kPrefetchBytes);
            __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
            __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, m80), 8), _mm256_slli_epi16(_mm256_and_si256(b, m7f), 7));
            t = _mm512_fmadd_ps(_mm512_cvtph_ps(h), _mm512_loadu_ps(x + i), t);
        }
        acc = _mm512_fmadd_ps(t, s, acc);
    }
    sum = _mm512_reduce_add_ps(acc);
#else
    alignas(64) float buf[16];
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t b1 = b0 + block < n ? b0 + block : n;
        const float s = scale[b0 / block];
        for (int64_t i = b0; i < b1; i += 16) {
            if ((i & 63) == 0) prefetch(w + i + kPrefetchBytes);
            e4m3x16(w + i, s, buf);
            sum += dot(buf, x + i, 16);
        }
    }
#endif
    return sum;
}

}  // namespace ftw::simd
