// What the decoders of nvfp4, mxfp4/ds_fp4 and mxfp8 share: weight rows of 16-byte units, each
// unit read with one scale word from the scale bank beside it (bank 2 + proj), so the loads and
// the staged interface (experts_kernels.cuh) are the same; a format adds VEC, decode, permute
// and post. BITS: bits per weight; SCALE_T: the scale bank's element; UNITS: 16-byte units per
// scale element (nvfp4: two e4m3 scales per unit as one 16-bit word, mxfp4: one E8M0 byte per
// unit, mxfp8: one E8M0 byte per two units).
#pragma once

#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {

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
