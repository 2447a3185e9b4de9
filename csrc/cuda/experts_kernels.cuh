// One templated kernel family for the routed experts of every format; a format contributes only
// its weight decoder (csrc/formats/<name>/cuda.cu). Included by .cu files only.
//
// Work: the routing kernel (experts.cu) groups the step's (token, k) pairs by expert into tiles
// of up to 16 (decode) or 64 (prefill) pairs of one expert, each with the expert's slot. Then
// two launches of experts_proj: phase 0 reads gate_up rows and writes act = activation(gate, up)
// (bf16, [T*K, I]); phase 1 reads down rows and adds weight * (down(act) + bias) into out [T, H].
// A block owns one tile and a band of output rows; the launch covers every routed expert.
//
// The matrix step is mma.sync m16n8k16 (bf16 in, f32 accumulate): the pairs are the M side (rows
// of A: x or act), eight weight rows the N side. Each lane reads 16 contiguous bytes of its weight
// row per step, exactly as the file stores them, and its decoder turns them into bf16 pairs in
// registers. A dot product does not care in which order k is summed, so the decoder may emit the
// pairs in any fixed order (fp4 gives (v0, v4), (v1, v5), ...) as long as the lane permutes its
// slice of x the same way (Dec::permute): lane (g, tig) supplies B column g and A row g for the
// same k positions, which depend only on tig. No host repack, no shared-memory staging.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "pools/pool_view.h"

namespace ftw::cuda {

// Everything a launch needs, by value (device pointers; shapes checked on the host).
struct KernelParams {
    const uint8_t* bank[kMaxBanks];
    int64_t row_bytes[kMaxBanks];
    const int32_t* slot_of_expert;
    int num_experts, num_slots;
    int H, I, T, K;
    const __nv_bfloat16* x;  // [T, H]
    const int32_t* topk_ids;  // [T, K]
    const float* topk_weights;  // [T, K]
    float* out;  // [T, H]
    __nv_bfloat16* act;  // [T*K, I]
    int32_t* sorted_pairs;  // [T*K]: pair ids grouped by expert
    int4* tiles;  // {slot, first sorted index, count, expert}
    int32_t* num_tiles;
    int32_t* error;  // 0, or 1 + first pair whose expert is out of range or not resident
    int act_kind;
    float alpha, limit;  // limit = +inf when the activation has none
    int gu_bias_bank, down_bias_bank;  // bank index, -1 when the layer has no biases
    int bias_f32;
    int block_out, block_in, scale_f32;  // fp8_block
};

constexpr float kTwo62 = 4.611686018427387904e18f;  // 2^62: scaled decoders emit w * 2^-62

// ---- small device helpers -------------------------------------------------------------------

// Weights are read once per step: stream them past L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// bf16 bits of 2^(s - 127 + shift) for an E8M0 byte s (255: NaN; past the bf16 range: inf).
__device__ __forceinline__ uint32_t e8m0_bf16(uint32_t s, int shift) {
    if (s == 255) return 0x7FC0u;
    int e = int(s) + shift;
    if (e >= 255) return 0x7F80u;
    if (e <= 0) return 0u;  // below 2^-126: only for scales far under any real checkpoint's
    return uint32_t(e) << 7;
}

// e4m3fn byte -> float (exact; 0x7F/0xFF give 480 rather than NaN: real weights never hold NaN).
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
    return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7Fu) << 20)) * 1.329227995784916e36f;  // * 2^120
}

// Four e4m3 bytes -> two bf16x2 holding value * 2^-120: out0 = (v0, v2), out1 = (v1, v3).
__device__ __forceinline__ void e4m3x4_raw(uint32_t q, uint32_t& out0, uint32_t& out1) {
    out0 = ((q << 8) & 0x80008000u) | ((q << 4) & 0x07F007F0u);
    out1 = (q & 0x80008000u) | ((q >> 4) & 0x07F007F0u);
}

// Eight e2m1 nibbles (low nibble first) -> four bf16x2 holding value * 2^-126 (0.5 lands on a
// bf16 subnormal, which bf16 multiplies keep): out[k] = (v_k, v_{k+4}).
__device__ __forceinline__ void e2m1x8_raw(uint32_t q, uint32_t (&out)[4]) {
    out[0] = ((q << 12) & 0x80008000u) | ((q << 6) & 0x01C001C0u);
    out[1] = ((q << 8) & 0x80008000u) | ((q << 2) & 0x01C001C0u);
    out[2] = ((q << 4) & 0x80008000u) | ((q >> 2) & 0x01C001C0u);
    out[3] = (q & 0x80008000u) | ((q >> 6) & 0x01C001C0u);
}

// x permutations matching the decoders' pair orders (X[j] = (x_2j, x_2j+1)).
template <int NR>
__device__ __forceinline__ void permute_identity(const uint32_t (&x)[NR], uint32_t (&a)[NR]) {
#pragma unroll
    for (int i = 0; i < NR; ++i) a[i] = x[i];
}

// fp8 order: per 4 values (v0, v2), (v1, v3).
template <int NR>
__device__ __forceinline__ void permute_fp8(const uint32_t (&x)[NR], uint32_t (&a)[NR]) {
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) {
        a[2 * i] = prmt(x[2 * i], x[2 * i + 1], 0x5410);
        a[2 * i + 1] = prmt(x[2 * i], x[2 * i + 1], 0x7632);
    }
}

// fp4 order: per 8 values (v0, v4), (v1, v5), (v2, v6), (v3, v7).
template <int NR>
__device__ __forceinline__ void permute_fp4(const uint32_t (&x)[NR], uint32_t (&a)[NR]) {
#pragma unroll
    for (int i = 0; i < NR / 4; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k)
            a[4 * i + k] = prmt(x[4 * i + k / 2], x[4 * i + 2 + k / 2], (k & 1) ? 0x7632 : 0x5410);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ const uint8_t* bank_row(const KernelParams& p, int bank, int slot) {
    return p.bank[bank] + int64_t(slot) * p.row_bytes[bank];
}

__device__ __forceinline__ float bias_at(const KernelParams& p, int bank, int slot, int r) {
    const uint8_t* row = bank_row(p, bank, slot);
    if (p.bias_f32) return __ldg(reinterpret_cast<const float*>(row) + r);
    return bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + r));
}

__device__ __forceinline__ float activate(const KernelParams& p, float g, float u) {
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
    if (p.act_kind == 1) return (u + 1.0f) * g / (1.0f + expf(-p.alpha * g));  // gpt-oss swiglu
    return g / (1.0f + expf(-g)) * u;  // silu(gate) * up
}

// ---- the kernel -----------------------------------------------------------------------------
//
// Template: Dec = the format's decoder; PH = 0 (gate_up + activation) or 1 (down + weighted sum);
// MT = 16-pair m-tiles per block (tile = 16 * MT pairs); NT = 8-row n-tiles per warp;
// KS = warps splitting the input dimension (reduced through shared memory); RG = warp rows.
//
// Decoder contract (see csrc/formats/*/cuda.cu):
//   VEC                          values per 16 stored weight bytes
//   Row row(p, proj, slot, r)    where row r of gate_up (proj 0) or down (proj 1) of `slot` is
//   Raw load(row, u)             the u-th 16-byte unit of the row (+ the scale it needs)
//   decode(raw, w[VEC/2])        bf16 pairs, value * 2^-62 for scaled formats (bf16: exact)
//   permute(x[VEC/2], a[VEC/2])  x's contiguous pairs into decode's pair order
//   post(p, proj, slot, r)       factor applied to row r's dot product (2^62 * global scale)
template <class Dec, int PH, int MT, int NT, int KS, int RG>
__global__ void __launch_bounds__(32 * KS * RG) experts_proj(const KernelParams p) {
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;  // bf16x2 registers per 16-byte unit
    const int tile_id = blockIdx.y;
    if (tile_id >= *p.num_tiles) return;
    const int4 tile = p.tiles[tile_id];
    const int slot = tile.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int ks = warp % KS, rg = warp / KS;
    const int in = PH == 0 ? p.H : p.I;
    const int nunits = in / V;
    const int nchunks = (nunits + 3) >> 2;
    const int ntile0 = (blockIdx.x * RG + rg) * NT;  // this warp's first n-tile

    typename Dec::Row row[NT];
    bool rok[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        int r;
        if (PH == 0) {  // n-tile columns: gate j, up j, gate j+1, up j+1, ...
            const int j = (ntile0 + n) * 4 + (g >> 1);
            rok[n] = j < p.I;
            r = (g & 1) ? p.I + j : j;
        } else {
            r = (ntile0 + n) * 8 + g;
            rok[n] = r < p.H;
        }
        row[n] = Dec::row(p, PH, slot, rok[n] ? r : 0);
    }

    const __nv_bfloat16* arow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int q = m * 16 + g + 8 * h;
            arow[m][h] = nullptr;
            if (q < tile.z) {
                const int pair = p.sorted_pairs[tile.y + q];
                arow[m][h] = PH == 0 ? p.x + int64_t(pair / p.K) * p.H : p.act + int64_t(pair) * p.I;
            }
        }

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;

    typename Dec::Raw cur[NT], nxt[NT];
    auto fetch = [&](int c, typename Dec::Raw (&raw)[NT]) {
        const int u = c * 4 + tig;
#pragma unroll
        for (int n = 0; n < NT; ++n) raw[n] = (rok[n] && u < nunits) ? Dec::load(row[n], u) : typename Dec::Raw{};
    };
    if (ks < nchunks) fetch(ks, cur);
    for (int c = ks; c < nchunks; c += KS) {
        if (c + KS < nchunks) fetch(c + KS, nxt);  // next unit's bytes in flight while this one computes
        const int u = c * 4 + tig;
        const bool uok = u < nunits;
        uint32_t w[NT][NR];
#pragma unroll
        for (int n = 0; n < NT; ++n) Dec::decode(cur[n], w[n]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            uint32_t a[2][NR];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t xr[NR];
                if (arow[m][h] != nullptr && uok) {
                    const uint4* src = reinterpret_cast<const uint4*>(arow[m][h] + int64_t(u) * V);
#pragma unroll
                    for (int i = 0; i < NR / 4; ++i) {
                        const uint4 v = __ldg(src + i);
                        xr[4 * i] = v.x, xr[4 * i + 1] = v.y, xr[4 * i + 2] = v.z, xr[4 * i + 3] = v.w;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < NR; ++i) xr[i] = 0u;
                }
                Dec::permute(xr, a[h]);
            }
#pragma unroll
            for (int s = 0; s < V / 4; ++s)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mma_bf16(acc[m][n], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], w[n][2 * s],
                             w[n][2 * s + 1]);
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) cur[n] = nxt[n];
    }

    if constexpr (KS > 1) {  // sum the K-split partials into warp ks == 0
        __shared__ float red[RG][KS - 1][MT * NT * 4][32];
        if (ks > 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) red[rg][ks - 1][(m * NT + n) * 4 + i][lane] = acc[m][n][i];
        }
        __syncthreads();
        if (ks > 0) return;
#pragma unroll
        for (int k = 0; k < KS - 1; ++k)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[m][n][i] += red[rg][k][(m * NT + n) * 4 + i][lane];
    }

    // Epilogue. Accumulator (m, n, i): pair slot m*16 + g + 8*(i/2), column 2*tig + (i&1).
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int q = m * 16 + g + 8 * h;
            if (q >= tile.z) continue;
            const int pair = p.sorted_pairs[tile.y + q];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                if (PH == 0) {
                    const int j = (ntile0 + n) * 4 + tig;  // columns 2tig, 2tig+1 = gate j, up j
                    if (j >= p.I) continue;
                    float gate = acc[m][n][2 * h] * Dec::post(p, 0, slot, j);
                    float up = acc[m][n][2 * h + 1] * Dec::post(p, 0, slot, p.I + j);
                    if (p.gu_bias_bank >= 0) {
                        gate += bias_at(p, p.gu_bias_bank, slot, j);
                        up += bias_at(p, p.gu_bias_bank, slot, p.I + j);
                    }
                    p.act[int64_t(pair) * p.I + j] = __float2bfloat16_rn(activate(p, gate, up));
                } else {
                    const float wt = p.topk_weights[pair];
                    float* dst = p.out + int64_t(pair / p.K) * p.H;
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int r = (ntile0 + n) * 8 + 2 * tig + e;
                        if (r >= p.H) continue;
                        float v = acc[m][n][2 * h + e] * Dec::post(p, 1, slot, r);
                        if (p.down_bias_bank >= 0) v += bias_at(p, p.down_bias_bank, slot, r);
                        atomicAdd(dst + r, wt * v);
                    }
                }
            }
        }
}

// ---- launch ---------------------------------------------------------------------------------

// Grouping of the step's pairs by expert (experts.cu): fills sorted_pairs, tiles, num_tiles, error.
void launch_route(const KernelParams& p, int tile_m, cudaStream_t stream);
int max_tiles(int pairs, int tile_m, int num_experts);
void check_launch(const char* what);  // throws CudaError on a launch error

// Decode: tiles of 16 pairs, 8 warps split each 16-row band's inputs. Prefill: tiles of 64 pairs,
// 4 warps each own 16 rows and reuse every decoded weight across the 64 pairs.
constexpr int kDecodeMaxPairs = 128;

template <class Dec>
void launch_experts(const KernelParams& p, cudaStream_t stream) {
    const int pairs = p.T * p.K;
    const bool prefill = pairs > kDecodeMaxPairs;
    const int tile_m = prefill ? 64 : 16;
    launch_route(p, tile_m, stream);
    const int tiles = max_tiles(pairs, tile_m, p.num_experts);
    if (prefill) {
        constexpr int MT = 4, NT = 2, KS = 1, RG = 4;
        dim3 g0((p.I + RG * NT * 4 - 1) / (RG * NT * 4), tiles), g1((p.H + RG * NT * 8 - 1) / (RG * NT * 8), tiles);
        experts_proj<Dec, 0, MT, NT, KS, RG><<<g0, 32 * KS * RG, 0, stream>>>(p);
        check_launch("gate_up kernel");
        experts_proj<Dec, 1, MT, NT, KS, RG><<<g1, 32 * KS * RG, 0, stream>>>(p);
        check_launch("down kernel");
    } else {
        constexpr int MT = 1, NT = 2, KS = 8, RG = 1;
        dim3 g0((p.I + RG * NT * 4 - 1) / (RG * NT * 4), tiles), g1((p.H + RG * NT * 8 - 1) / (RG * NT * 8), tiles);
        experts_proj<Dec, 0, MT, NT, KS, RG><<<g0, 32 * KS * RG, 0, stream>>>(p);
        check_launch("gate_up kernel");
        experts_proj<Dec, 1, MT, NT, KS, RG><<<g1, 32 * KS * RG, 0, stream>>>(p);
        check_launch("down kernel");
    }
}

// ---- registration ---------------------------------------------------------------------------

// A format's bank checks: throws FormatError naming the bank when its rows are too short,
// misaligned or missing. Called before any launch.
struct BankNeed {
    int bank;
    const char* name;
    int64_t bytes;  // row bytes the kernel reads
    int align;      // alignment the kernel's loads need
    bool optional;  // biases: absent (nullptr / 0) is fine
};

struct CudaFormat {
    const char* name;
    int vec;  // values per 16 stored bytes: H and I must be multiples
    // bank needs for H, I and options; fills at most kMaxBanks entries, returns the count
    int (*needs)(int H, int I, const KernelParams& p, BankNeed* out);
    void (*launch)(const KernelParams& p, cudaStream_t stream);
    int gu_bias_bank, down_bias_bank;  // -1: the format has no biases
    bool uses_fp8_block_options;
};

struct CudaFormatRegistrar {
    explicit CudaFormatRegistrar(const CudaFormat* f);
};

}  // namespace ftw::cuda

// In csrc/formats/<name>/cuda.cu: FTW_CUDA_FORMAT(nvfp4, Nvfp4Decoder, needs_fn, gu_bias, d_bias, fp8opts)
#define FTW_CUDA_FORMAT(NAME, DEC, NEEDS, GU_BIAS, D_BIAS, FP8OPTS)                                  \
    static const ::ftw::cuda::CudaFormat ftw_cuda_format_##NAME = {                                 \
        #NAME, DEC::VEC, NEEDS, &::ftw::cuda::launch_experts<DEC>, GU_BIAS, D_BIAS, FP8OPTS};       \
    static const ::ftw::cuda::CudaFormatRegistrar ftw_cuda_registrar_##NAME(&ftw_cuda_format_##NAME)
