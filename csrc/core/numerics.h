// Number codes the expert formats store, decoded to float32: bf16, f16, e4m3fn, e8m0, e2m1;
// and float32 -> bf16 / e4m3 for outputs and activation quantization. Every decode is exact
// (each of these codes is a float32 value). Tables are constexpr: usable from any static
// initializer, and no guard in inner loops.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ftw::num {

inline float bits_to_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint32_t f32_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float bf16_to_f32(uint16_t b) { return bits_to_f32(uint32_t(b) << 16); }

// round to nearest even; NaN stays NaN
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return bits_to_f32(sign | 0x7F800000u | (m << 13));  // inf, NaN
    if (e == 0) {                                                        // zero, subnormal
        float v = float(m) * (1.0f / 16777216.0f);                       // m * 2^-24
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((e + 112) << 23) | (m << 13));
}

namespace detail {

constexpr float pow2(int e) {
    float r = 1.0f;
    for (; e > 0; --e) r *= 2.0f;
    for (; e < 0; ++e) r *= 0.5f;
    return r;
}

constexpr std::array<float, 256> e4m3_table() {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
        int e = (b >> 3) & 0xF, m = b & 7;
        float v = e == 0 ? float(m) * pow2(-9) : (1.0f + float(m) / 8.0f) * pow2(e - 7);
        if ((b & 0x7F) == 0x7F) v = std::numeric_limits<float>::quiet_NaN();
        t[b] = (b & 0x80) ? -v : v;
    }
    return t;
}

constexpr std::array<float, 256> e8m0_table() {
    std::array<float, 256> t{};
    for (int b = 0; b < 255; ++b) t[b] = pow2(b - 127);
    t[255] = std::numeric_limits<float>::quiet_NaN();
    return t;
}

}  // namespace detail

inline constexpr std::array<float, 256> kE4M3 = detail::e4m3_table();  // e4m3fn: S.1111.111 NaN
inline constexpr std::array<float, 256> kE8M0 = detail::e8m0_table();  // 2^(b-127), 255 NaN
inline constexpr std::array<float, 16> kE2M1 = {0.f,  .5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                                -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

inline float e4m3_to_f32(uint8_t b) { return kE4M3[b]; }
inline float e8m0_to_f32(uint8_t b) { return kE8M0[b]; }

// float32 -> the nearest e4m3fn value (round half to even), saturating at +-448 (what a
// saturating cast to float8_e4m3fn gives); NaN stays NaN.
inline float round_to_e4m3(float x) {
    float a = std::fabs(x);
    if (!(a < 448.0f)) return std::isnan(x) ? x : std::copysign(448.0f, x);
    float q;
    if (a < 0.015625f) {                       // below 2^-6: subnormal steps of 2^-9
        q = std::nearbyint(a * 512.0f) * (1.0f / 512.0f);
    } else {
        int e;
        std::frexp(a, &e);                     // a = f * 2^e, f in [0.5, 1): step 2^(e-4)
        float step = std::ldexp(1.0f, e - 4);
        q = std::nearbyint(a / step) * step;   // exact scaling by a power of two
        if (q > 448.0f) q = 448.0f;
    }
    return std::copysign(q, x);
}

}  // namespace ftw::num
