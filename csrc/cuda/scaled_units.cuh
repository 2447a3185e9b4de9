// What the decoders of nvfp4, mxfp4/ds_fp4 and mxfp8 share: weight rows of 16-byte units, each
// unit read with one scale word from the scale bank beside it (bank 2 + proj), so the loads and
// the staged interface (experts_kernels.cuh) are the same; a format adds VEC, decode, permute
// and post. BITS: bits per weight; SCALE_T: the scale bank's element; UNITS: 16-byte units per
// scale element (nvfp4: two e4m3 scales per unit as one 16-bit word, mxfp4: one E8M0 byte per
// unit, mxfp8: one E8M0 byte per two units).
#pragma once

#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {

// Eight e2m1 nibbles (low nibble first) -> four bf16x2 holding value * 2^-126, out[k] = (v_k, v_{k+4}):
// the pairs of e2m1x8_raw, by one multiply per pair instead of two shifts: a masked nibble pair
// times 0x1040 is the pair shifted by 6 (magnitudes into the exponent's low bits) plus by 12
// (signs into bit 15), with no carries between them. 13 instructions per 8 values where the
// shifts take 16 (equal to e2m1x8_raw for every 32-bit word, checked exhaustively on the host).
__device__ __forceinline__ void e2m1x8_raw_mul(uint32_t q, uint32_t (&out)[4]) {
    const uint32_t h = q >> 8;  // nibbles 2, 3 (and 6, 7) where 0, 1 (4, 5) were
    out[0] = ((q & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    out[1] = ((q & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
    out[2] = ((h & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    out[3] = ((h & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
}

// A 16-byte unit of e2m1 pairs unscaled (value * 2^-126, in e2m1x8_raw_mul's pair order): the
// staged kernel's unit columns (kOptUnitCols) apply the scales to the float32 sums instead.
__device__ __forceinline__ void e2m1_unit_raw(const uint4& u, uint32_t (&r)[16]) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t v[4];
        e2m1x8_raw_mul(q[i], v);
#pragma unroll
        for (int k = 0; k < 4; ++k) r[4 * i + k] = v[k];
    }
}

template <int BITS, class SCALE_T, int UNITS>
struct ScaledUnits {
    struct Row {
        const uint4* w;
        const SCALE_T* s;
    };
    struct Raw {
        uint4 w;
        uint32_t s;
    };
    __device__ static int64_t weight_row_bytes(const KernelParams& p, int proj) {
        return int64_t(proj == 0 ? p.H : p.I) * BITS / 8;
    }
    __device__ static const uint8_t* weights(const KernelParams& p, int proj, int slot) { return bank_row(p, proj, slot); }
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int64_t scales = weight_row_bytes(p, proj) / (16 * UNITS);  // SCALE_T per row
        return {reinterpret_cast<const uint4*>(weights(p, proj, slot) + r * weight_row_bytes(p, proj)),
                reinterpret_cast<const SCALE_T*>(bank_row(p, 2 + proj, slot)) + r * scales};
    }
    __device__ static Raw load(const Row& row, int u) { return {ld_stream(row.w + u), __ldg(row.s + u / UNITS)}; }

    static constexpr bool kStaged = true;  // decode: experts_decode_staged (units through shared memory)
    struct Side {
        uint32_t s;
    };
    __device__ static Side side(const Row& row, int u) { return {__ldg(row.s + u / UNITS)}; }
    __device__ static Raw raw(const uint4& w, const Side& s) { return {w, s.s}; }
};

}  // namespace ftw::cuda
