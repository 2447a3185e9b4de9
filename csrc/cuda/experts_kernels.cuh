// One templated kernel family for the routed experts of every format; a format contributes only
// its weight decoder (csrc/formats/<name>/cuda.cu). Included by .cu files only.
//
// Work: phase 0 reads gate_up rows and writes act = activation(gate, up) (bf16, [T*K, I]);
// phase 1 reads down rows and adds weight * (down(act) + bias) into out [T, H]. Each phase is
// one launch covering every routed expert. Decode (experts_decode, T <= 8): every block finds
// the step's distinct experts from topk_ids itself and serves a band of rows of some of them.
// Prefill (experts_proj): the routing kernel (experts.cu) first groups the (token, k) pairs by
// expert into tiles of up to 64 pairs of one expert, each with the expert's slot.
//
// The matrix step is mma.sync m16n8k16 (bf16 in, f32 accumulate). Each lane reads 16 contiguous
// bytes of a weight row per step, exactly as the file stores them, and its decoder turns them
// into bf16 pairs in registers. A dot product does not care in which order k is summed, so the
// decoder may emit the pairs in any fixed order (fp4 gives (v0, v4), (v1, v5), ...) as long as
// the lane permutes its slice of x the same way (Dec::permute): a lane supplies its weight row
// and its pair's x for the same k positions, which depend only on its position tig in the quad.
// Decode puts 16 weight rows on the M side and up to 8 pairs on N; prefill puts 64 pairs on M
// (4 m-tiles) and 8-row weight tiles on N. No host repack, no shared-memory staging.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
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
    int ggml_type[3];  // gguf: ggml type ids of the gate, up and down rows
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

// The two epilogues both kernels end in. Phase 0: row j of gate and of up (j < I) of `pair`,
// biased, through the activation into act. Phase 1: row r of down, biased and weighted, added
// into the token's output (experts of one token add concurrently: atomic).
template <class Dec>
__device__ __forceinline__ void store_activation(const KernelParams& p, int pair, int slot, int j, float gate_acc,
                                                 float up_acc) {
    float gate = gate_acc * Dec::post(p, 0, slot, j);
    float up = up_acc * Dec::post(p, 0, slot, p.I + j);
    if (p.gu_bias_bank >= 0) {
        gate += bias_at(p, p.gu_bias_bank, slot, j);
        up += bias_at(p, p.gu_bias_bank, slot, p.I + j);
    }
    p.act[int64_t(pair) * p.I + j] = __float2bfloat16_rn(activate(p, gate, up));
}

template <class Dec>
__device__ __forceinline__ void add_down_row(const KernelParams& p, int pair, int slot, int r, float acc) {
    float v = acc * Dec::post(p, 1, slot, r);
    if (p.down_bias_bank >= 0) v += bias_at(p, p.down_bias_bank, slot, r);
    atomicAdd(p.out + int64_t(pair / p.K) * p.H + r, p.topk_weights[pair] * v);
}

// ---- the kernels ----------------------------------------------------------------------------
//
// Two kernels share the decoders: experts_decode (T <= 8, T*K <= 128: each block finds its expert
// itself from topk_ids, no routing kernel, K-split across warps) and experts_proj (prefill: tiles
// of 64 pairs of one expert made by the routing kernel). Template: Dec = the format's decoder;
// PH = 0 (gate_up + activation) or 1 (down + weighted sum); NT, MT, RG = tiles per warp / block.
//
// Decoder contract (see csrc/formats/*/cuda.cu):
//   VEC                          values per 16 stored weight bytes
//   Row row(p, proj, slot, r)    where row r of gate_up (proj 0) or down (proj 1) of `slot` is
//   Raw load(row, u)             the u-th 16-byte unit of the row (+ the scale it needs)
//   decode(raw, w[VEC/2])        bf16 pairs (value * 2^-62, or 2^-56 for fp8_block; bf16 exact)
//   permute(x[VEC/2], a[VEC/2])  x's contiguous pairs into decode's pair order
//   post(p, proj, slot, r)       factor applied to row r's dot product (2^62 * global scale)
//   kChunkScale, chunk_scale(p, proj, slot, r, c)   optional: a float32 scale per row and
//                                64-value chunk, applied to each chunk's partial sums (fp8_block)
constexpr int kDecodeMaxPairs = 128;  // T * K at most, for experts_decode
constexpr int kMaxKSplit = 8;

struct Tile {
    int slot, count;
    const int32_t* pairs;  // `count` pair ids (t * K + k)
};

// experts_decode's routing, done by every block (no routing kernel): the step's distinct experts
// in order of first appearance (s_dexp, count returned); block (0, 0) of phase 0 writes the error
// word (first pair whose expert is out of range or not resident). Block y then serves distinct
// experts y, y + gridDim.y, ...; both phases derive the same list.
template <int PH>
__device__ int decode_experts(const KernelParams& p, int* s_ids, int* s_first, int* s_dexp, int* s_meta) {
    const int P = p.T * p.K, tid = threadIdx.x;
    if (tid == 0) s_meta[0] = 0, s_meta[1] = INT_MAX;
    for (int i = tid; i < P; i += blockDim.x) s_ids[i] = p.topk_ids[i];
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        const int e = s_ids[i];
        bool first = true;
        for (int j = 0; j < i; ++j) first &= s_ids[j] != e;
        s_first[i] = first;
        if (first) atomicAdd(&s_meta[0], 1);
        const int s = (e >= 0 && e < p.num_experts) ? p.slot_of_expert[e] : -1;
        if (s < 0 || s >= p.num_slots) atomicMin(&s_meta[1], i);
    }
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        if (!s_first[i]) continue;
        int rank = 0;
        for (int j = 0; j < i; ++j) rank += s_first[j];
        s_dexp[rank] = s_ids[i];
    }
    __syncthreads();
    if (PH == 0 && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0)
        *p.error = s_meta[1] == INT_MAX ? 0 : s_meta[1] + 1;
    return s_meta[0];
}

// The pairs routed to expert e (at most 8: a token lists an expert once, T <= 8), into s_pairs.
// Returns the tile; count 0 when e is out of range or not resident (skipped, flagged above).
__device__ inline Tile decode_tile(const KernelParams& p, int e, const int* s_ids, int* s_pairs) {
    const int P = p.T * p.K;
    Tile t{0, 0, s_pairs};
    if (e < 0 || e >= p.num_experts) return t;
    const int slot = p.slot_of_expert[e];
    if (slot < 0 || slot >= p.num_slots) return t;
    int n = 0;
    for (int i = 0; i < P; ++i) {
        if (s_ids[i] != e) continue;
        if (n < 8 && int(threadIdx.x) == n) s_pairs[n] = i;
        ++n;
    }
    __syncthreads();
    t.slot = slot, t.count = min(n, 8);  // more only if a token lists an expert twice (refused on the host)
    return t;
}

template <class Dec>
struct HasChunkScale {
    template <class D>
    static constexpr bool test(decltype(D::kChunkScale)*) { return D::kChunkScale; }
    template <class D>
    static constexpr bool test(...) { return false; }
    static constexpr bool value = test<Dec>(nullptr);
};

// Decode (T <= 8): the weights are the M side of the mma (16 rows: lane group g reads rows g and
// g + 8 of a tile), the step's pairs of one expert the N side (8 columns), so one mma.sync serves
// 16 rows; KS warps split the input dimension; each lane keeps D units of weights and x in flight.
// PH 0 tiles pair gate row j (row g) with up row j (row g + 8), so a lane holds both for its j.

// One expert's share of a decode step: this block's rows of the expert in `tile`, every pair.
template <class Dec, int PH, int NT>
__device__ __forceinline__ void decode_expert(const KernelParams& p, const Tile& tile,
                                              float (&red)[kMaxKSplit - 1][NT * 4][32]) {
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;  // bf16x2 registers per 16-byte unit
    constexpr int NX = NR / 4;  // 16-byte loads of x per unit
    constexpr int D = V == 16 ? 3 : 2;  // units in flight: what fits in 128 registers
    constexpr bool CS = HasChunkScale<Dec>::value;
    const int KS = blockDim.x / 32;
    const int slot = tile.slot;
    const int ks = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int in = PH == 0 ? p.H : p.I;
    const int nunits = in / V;
    const int nchunks = (nunits + 3) >> 2;

    typename Dec::Row row[NT][2];
    bool rok[NT][2];
    int rix[NT][2];  // the rows, clamped in range (for scales of rows past the end)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int r;
            if (PH == 0) {
                const int j = (blockIdx.x * NT + n) * 8 + g;
                rok[n][h] = j < p.I;
                r = h ? p.I + j : j;
            } else {
                r = (blockIdx.x * NT + n) * 16 + g + 8 * h;
                rok[n][h] = r < p.H;
            }
            rix[n][h] = rok[n][h] ? r : 0;
            row[n][h] = Dec::row(p, PH, slot, rix[n][h]);
        }
    const __nv_bfloat16* xrow = nullptr;
    if (g < tile.count) {
        const int pair = tile.pairs[g];
        xrow = PH == 0 ? p.x + int64_t(pair / p.K) * p.H : p.act + int64_t(pair) * p.I;
    }

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;

    struct Stage {
        typename Dec::Raw w[NT][2];
        uint4 x[NX];
    };
    Stage ring[D];
    auto fetch = [&](int c, Stage& st) {
        const int u = c * 4 + tig;
        const bool uok = u < nunits;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                st.w[n][h] = (rok[n][h] && uok) ? Dec::load(row[n][h], u) : typename Dec::Raw{};
        const uint4* src = reinterpret_cast<const uint4*>(xrow + int64_t(u) * V);
#pragma unroll
        for (int i = 0; i < NX; ++i) st.x[i] = (xrow != nullptr && uok) ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
    };
#pragma unroll
    for (int d = 0; d < D; ++d) fetch(ks + d * KS, ring[d]);

    for (int c0 = ks; c0 < nchunks; c0 += D * KS) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = c0 + d * KS;
            if (c >= nchunks) break;  // warp-uniform
            const Stage cur = ring[d];
            fetch(c + D * KS, ring[d]);  // D units stay in flight while this one computes
            uint32_t xr[NR], xa[NR];
#pragma unroll
            for (int i = 0; i < NX; ++i)
                xr[4 * i] = cur.x[i].x, xr[4 * i + 1] = cur.x[i].y, xr[4 * i + 2] = cur.x[i].z, xr[4 * i + 3] = cur.x[i].w;
            Dec::permute(xr, xa);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                uint32_t wa[NR], wb[NR];
                Dec::decode(cur.w[n][0], wa);
                Dec::decode(cur.w[n][1], wb);
                float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int s = 0; s < V / 4; ++s)
                    mma_bf16(CS ? part : acc[n], wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1], xa[2 * s],
                             xa[2 * s + 1]);
                if constexpr (CS) {
                    const float s0 = Dec::chunk_scale(p, PH, slot, rix[n][0], c);
                    const float s1 = Dec::chunk_scale(p, PH, slot, rix[n][1], c);
                    acc[n][0] += part[0] * s0, acc[n][1] += part[1] * s0;
                    acc[n][2] += part[2] * s1, acc[n][3] += part[3] * s1;
                }
            }
        }
    }

    if (KS > 1 && ks > 0) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[ks - 1][n * 4 + i][lane] = acc[n][i];
    }
    __syncthreads();
    if (ks == 0) {
        for (int k = 0; k < KS - 1; ++k)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[n][i] += red[k][n * 4 + i][lane];

        // Epilogue. Accumulator (n, i): row g + 8*(i/2) of tile n, pair slot 2*tig + (i&1).
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int q = 2 * tig + e;
            if (q >= tile.count) continue;
            const int pair = tile.pairs[q];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                if (PH == 0) {
                    const int j = (blockIdx.x * NT + n) * 8 + g;
                    if (j >= p.I) continue;
                    store_activation<Dec>(p, pair, slot, j, acc[n][e], acc[n][2 + e]);
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = (blockIdx.x * NT + n) * 16 + g + 8 * h;
                        if (r >= p.H) continue;
                        add_down_row<Dec>(p, pair, slot, r, acc[n][2 * h + e]);
                    }
                }
            }
        }
    }
}

// The decode kernel: routing once per block, then this block row's share of the distinct experts.
template <class Dec, int PH, int NT>
__global__ void __launch_bounds__(kMaxKSplit * 32, 2) experts_decode(const KernelParams p) {
    __shared__ int s_ids[kDecodeMaxPairs], s_first[kDecodeMaxPairs], s_dexp[kDecodeMaxPairs], s_pairs[8], s_meta[2];
    __shared__ float red[kMaxKSplit - 1][NT * 4][32];  // K-split partials, summed into warp 0
    if (PH == 0) {  // phase 1 adds into out: clear it here, before any block leaves
        const int64_t n = int64_t(p.T) * p.H, stride = int64_t(gridDim.x) * gridDim.y * blockDim.x;
        for (int64_t i = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
            p.out[i] = 0.f;
    }
    const int nexp = decode_experts<PH>(p, s_ids, s_first, s_dexp, s_meta);
    for (int dx = blockIdx.y; dx < nexp; dx += gridDim.y) {  // block-uniform
        const Tile tile = decode_tile(p, s_dexp[dx], s_ids, s_pairs);
        if (tile.count == 0) continue;
        decode_expert<Dec, PH, NT>(p, tile, red);
        __syncthreads();  // s_pairs and red are rewritten for the next expert
    }
}

// Prefill: a block serves one routed tile (up to 16 * MT pairs of one expert, from the routing
// kernel) and a band of RG * NT * 8 rows; the pairs are the mma's M side (MT m-tiles), the
// weight rows its N side, so each warp decodes a unit once and uses it for all MT m-tiles.
// No K split (KS = 1). 3 blocks per SM: measured faster than leaving the registers unbounded.
template <class Dec, int PH, int MT, int NT, int RG>
__global__ void __launch_bounds__(32 * RG, 3) experts_proj(const KernelParams p) {
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;   // bf16x2 registers per 16-byte unit
    constexpr int D = 2;  // weight units in flight per lane and n-tile
    constexpr bool CS = HasChunkScale<Dec>::value;
    constexpr int KS = 1;

    if (int(blockIdx.y) >= *p.num_tiles) return;
    const int4 t4 = p.tiles[blockIdx.y];
    const Tile tile{t4.x, t4.z, p.sorted_pairs + t4.y};
    const int slot = tile.slot;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int ks = 0, rg = warp;
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
    // rows of this lane's accumulator columns (2tig, 2tig+1) per n-tile, for chunk scales
    int crow[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if (PH == 0) {
                const int j = min((ntile0 + n) * 4 + tig, p.I - 1);
                crow[n][e] = e ? p.I + j : j;
            } else {
                crow[n][e] = min((ntile0 + n) * 8 + 2 * tig + e, p.H - 1);
            }
        }

    const __nv_bfloat16* arow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int q = m * 16 + g + 8 * h;
            arow[m][h] = nullptr;
            if (q < tile.count) {
                const int pair = tile.pairs[q];
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

    typename Dec::Raw ring[D][NT];
    auto fetch = [&](int c, typename Dec::Raw (&raw)[NT]) {
        const int u = c * 4 + tig;
#pragma unroll
        for (int n = 0; n < NT; ++n) raw[n] = (rok[n] && u < nunits) ? Dec::load(row[n], u) : typename Dec::Raw{};
    };
#pragma unroll
    for (int d = 0; d < D; ++d) fetch(ks + d * KS, ring[d]);

    for (int c0 = ks; c0 < nchunks; c0 += D * KS) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = c0 + d * KS;
            if (c >= nchunks) break;  // warp-uniform
            typename Dec::Raw cur[NT];
#pragma unroll
            for (int n = 0; n < NT; ++n) cur[n] = ring[d][n];
            fetch(c + D * KS, ring[d]);  // D units stay in flight while this one computes
            const int u = c * 4 + tig;
            const bool uok = u < nunits;
            uint32_t w[NT][NR];
#pragma unroll
            for (int n = 0; n < NT; ++n) Dec::decode(cur[n], w[n]);
            float part[MT][NT][4];  // this chunk's sums when the decoder scales per chunk
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) part[m][n][i] = 0.f;
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
                        mma_bf16(CS ? part[m][n] : acc[m][n], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1],
                                 a[1][2 * s + 1], w[n][2 * s], w[n][2 * s + 1]);
            }
            if constexpr (CS) {
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const float s0 = Dec::chunk_scale(p, PH, slot, crow[n][0], c);
                    const float s1 = Dec::chunk_scale(p, PH, slot, crow[n][1], c);
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        acc[m][n][0] += part[m][n][0] * s0, acc[m][n][1] += part[m][n][1] * s1;
                        acc[m][n][2] += part[m][n][2] * s0, acc[m][n][3] += part[m][n][3] * s1;
                    }
                }
            }
        }
    }

    // Epilogue. Accumulator (m, n, i): pair slot m*16 + g + 8*(i/2), column 2*tig + (i&1).
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int q = m * 16 + g + 8 * h;
            if (q >= tile.count) continue;
            const int pair = tile.pairs[q];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                if (PH == 0) {
                    const int j = (ntile0 + n) * 4 + tig;  // columns 2tig, 2tig+1 = gate j, up j
                    if (j >= p.I) continue;
                    store_activation<Dec>(p, pair, slot, j, acc[m][n][2 * h], acc[m][n][2 * h + 1]);
                } else {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int r = (ntile0 + n) * 8 + 2 * tig + e;
                        if (r >= p.H) continue;
                        add_down_row<Dec>(p, pair, slot, r, acc[m][n][2 * h + e]);
                    }
                }
            }
        }
}

// ---- launch ---------------------------------------------------------------------------------

// Grouping of the step's pairs by expert for prefill (experts.cu): fills sorted_pairs, tiles,
// num_tiles and the error word, and clears out.
void launch_route(const KernelParams& p, int tile_m, cudaStream_t stream);
int max_tiles(int pairs, int tile_m, int num_experts);
void check_launch(const char* what);  // throws CudaError on a launch error

// Warps splitting one row: enough 4-unit chunks per warp (about 6) to keep D units in flight.
inline int k_split(int in, int vec) {
    const int chunks = (in / vec + 3) / 4;
    int ks = 1;
    while (ks < kMaxKSplit && chunks / (2 * ks) >= 6) ks *= 2;
    return ks;
}

// Decode (T <= 8, T * K <= 128): two launches per layer-step, blocks find their expert themselves.
// Prefill: the routing kernel makes tiles of 64 pairs of one expert; 4 warps each own 16 rows and
// reuse every decoded weight across the 64 pairs. DecDown: down's decoder where it differs from
// gate_up's (gguf picks one per projection from the layer's ggml types).
template <class Dec, class DecDown = Dec>
void launch_experts(const KernelParams& p, cudaStream_t stream) {
    const int pairs = p.T * p.K;
    if (pairs <= kDecodeMaxPairs && p.T <= 8) {
        constexpr int NT0 = Dec::VEC == 8 ? 2 : 1;  // 16-row tiles per warp (bf16 decodes for free)
        constexpr int NT1 = DecDown::VEC == 8 ? 2 : 1;
        const int ks0 = k_split(p.H, Dec::VEC), ks1 = k_split(p.I, DecDown::VEC);
        const int ny = std::min(pairs, 8);  // each block row serves every 8th distinct expert
        dim3 g0((p.I + NT0 * 8 - 1) / (NT0 * 8), ny), g1((p.H + NT1 * 16 - 1) / (NT1 * 16), ny);
        experts_decode<Dec, 0, NT0><<<g0, 32 * ks0, 0, stream>>>(p);
        check_launch("gate_up kernel");
        experts_decode<DecDown, 1, NT1><<<g1, 32 * ks1, 0, stream>>>(p);
        check_launch("down kernel");
    } else {
        constexpr int MT = 4, NT = 2, RG = 4;
        launch_route(p, 16 * MT, stream);
        const int tiles = max_tiles(pairs, 16 * MT, p.num_experts);
        dim3 g0((p.I + RG * NT * 4 - 1) / (RG * NT * 4), tiles), g1((p.H + RG * NT * 8 - 1) / (RG * NT * 8), tiles);
        experts_proj<Dec, 0, MT, NT, RG><<<g0, 32 * RG, 0, stream>>>(p);
        check_launch("gate_up kernel");
        experts_proj<DecDown, 1, MT, NT, RG><<<g1, 32 * RG, 0, stream>>>(p);
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
