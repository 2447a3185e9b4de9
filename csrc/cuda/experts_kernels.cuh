// One templated kernel family for the routed experts of every format; a format contributes only
// its weight decoder (csrc/formats/<name>/cuda.cu). Included by .cu files only.
//
// Work: phase 0 reads gate_up rows and writes act = activation(gate, up) (bf16, [T*K, I]);
// phase 1 reads down rows and adds weight * (down(act) + bias) into out [T, H]. Each phase is
// one launch covering every routed expert. Decode (T <= 8): every block finds the step's
// distinct experts from topk_ids itself and serves bands of rows of some of them, either with
// its weight units in flight in registers (experts_decode) or staged through shared memory by
// cp.async (experts_decode_staged, for decoders that choose it: see its comment).
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
// (4 m-tiles) and 8-row weight tiles on N. No host repack.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

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
    // T = 1: token 0's x in integers for phase 0's int8 units (kOptInt8; quantize_int8 writes it
    // before phase 0): [H / 32] groups of 64 bytes (32 int8 hi, 32 int8 lo, in the decoder's order),
    // then [H / 32] float2 {s / 254, int bits of 254 sum(hi) + sum(lo)}. T = 2..8: the tokens' x for
    // kOptInt8Tokens (quantize_int8_tokens): [T][H / 32] units of 64 bytes, then [T][H / 256] floats
    // (a scale per token and chunk). Null where T > 8
    uint8_t* xq;
    // T = 1: act in integers for phase 1's int8 units (quantize_int8 after phase 0): [K * I / 32]
    // groups (pair k's group u at k * I / 32 + u) as xq's, then their float2. T = 2..8: the T K
    // pairs' act for kOptInt8Tokens as xq's. Null where T > 8
    uint8_t* actq;
};

constexpr float kTwo62 = 4.611686018427387904e18f;  // 2^62: scaled decoders emit w * 2^-62

// ---- small device helpers -------------------------------------------------------------------

// Weights are read once per step: stream them past L1. L2Bytes (128 or 256): the L2 fetches that
// much around the address from memory (the next units of the row arrive ahead of their loads).
template <int L2Bytes = 0>
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    if constexpr (L2Bytes == 256)
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    else if constexpr (L2Bytes == 128)
        asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    else
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
// Branchless (it runs per unit in the decode loops): clamp the exponent to 0 (zero: below 2^-126,
// only for scales far under any real checkpoint's) .. 255 (0x7F80, inf).
__device__ __forceinline__ uint32_t e8m0_bf16(uint32_t s, int shift) {
    const uint32_t m = uint32_t(min(max(int(s) + shift, 0), 255)) << 7;
    return s == 255 ? 0x7FC0u : m;
}

// e8m0_bf16(s, shift) in both halves of a bf16x2, for shift >= 0 (so s + shift never drops
// below 0): min(s + shift, 255) placed by one multiply (the DPX add-and-clamp and an IMAD, where
// e8m0_bf16 and its duplication take six), NaN's extra mantissa bit added for s = 255.
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t s, int shift) {
    return __viaddmin_u32(s, uint32_t(shift), 255u) * 0x00800080u + (s == 255 ? 0x00400040u : 0u);
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

// Where value j of a row goes when the row is stored in permute_fp4's / permute_fp8's pair order
// (loading that row's contiguous pairs then gives what permute makes of the row as it was).
__device__ __forceinline__ int fp4_pair_pos(int j) { const int r = j & 7; return (j & ~7) | (r < 4 ? 2 * r : 2 * r - 7); }
__device__ __forceinline__ int fp8_pair_pos(int j) { const int r = j & 3; return (j & ~3) | (r == 1 ? 2 : r == 2 ? 1 : r); }

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
                                                 float up_acc, int at = -1,
                                                 float scale = 1.f) {  // at: act column (j if < 0); scale: a power of 2 on act
    float gate = gate_acc * Dec::post(p, 0, slot, j);
    float up = up_acc * Dec::post(p, 0, slot, p.I + j);
    if (p.gu_bias_bank >= 0) {
        gate += bias_at(p, p.gu_bias_bank, slot, j);
        up += bias_at(p, p.gu_bias_bank, slot, p.I + j);
    }
    p.act[int64_t(pair) * p.I + (at < 0 ? j : at)] = __float2bfloat16_rn(activate(p, gate, up) * scale);
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
//   decode(raw, w[VEC/2])        bf16 pairs (value * 2^-62, or the value for fp8_block; bf16 exact)
//   permute(x[VEC/2], a[VEC/2])  x's contiguous pairs into decode's pair order
//   post(p, proj, slot, r)       factor applied to row r's dot product (2^62 * global scale)
//   kChunkScale                  optional: a float32 scale per row and 64-value chunk, applied
//                                to each chunk's partial sums (fp8_block), read through
//   ChunkRow chunk_row(p, proj, slot, r)   where row r's scales start (once per row), and
//   chunk_scale(p, proj, crow, c)          the scale of its chunk c (values 64c .. 64c + 63)
constexpr int kDecodeMaxPairs = 128;  // T * K at most, for experts_decode
constexpr int kMaxKSplit = 8;

// Phase 0 of a decode step may be launched as a programmatic dependent of the stream's previous
// kernel (phase0_programmatic, on the host, off by default: the previous step's phase 1, which
// lets it start once its own blocks have routed), so that its blocks are resident when that
// kernel ends, not a launch later. Every phase 0 block therefore waits here, before it reads or
// writes anything (x, topk_ids, the slot table and the weights may come from that kernel; out and
// act are what it still reads). Without a programmatic launch the wait returns at once.
__device__ __forceinline__ void phase0_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

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

// A decoder's optional members, looked up at compile time (one mechanism for every optional
// interface here and in the gguf decoders): FTW_OPTIONAL_MEMBER(Name, member, T, fallback) defines
// Name<D>::value, D::member where D declares it, else fallback; FTW_HAS_MEMBER(Name, member)
// whether D declares it.
#define FTW_OPTIONAL_MEMBER(Name, member, T, fallback)        \
    template <class D, class = void>                           \
    struct Name {                                              \
        static constexpr T value = fallback;                   \
    };                                                         \
    template <class D>                                         \
    struct Name<D, std::void_t<decltype(&D::member)>> {        \
        static constexpr T value = D::member;                  \
    }
#define FTW_HAS_MEMBER(Name, member)                           \
    template <class D, class = void>                           \
    struct Name : std::false_type {};                          \
    template <class D>                                         \
    struct Name<D, std::void_t<decltype(&D::member)>> : std::true_type {}

FTW_OPTIONAL_MEMBER(HasChunkScale, kChunkScale, bool, false);

// Rows sharing one chunk scale row, in aligned groups (optional Dec::kScaleRows; 1: none known):
// the register-fed decode loads one scale per group of its tiles' rows.
FTW_OPTIONAL_MEMBER(ScaleRowsOf, kScaleRows, int, 1);

// Where a chunk-scaled decoder's row scales start (ChunkRow), or nothing for other decoders.
template <class Dec, bool CS = HasChunkScale<Dec>::value>
struct ChunkRowOf {
    using type = typename Dec::ChunkRow;
};
template <class Dec>
struct ChunkRowOf<Dec, false> {
    using type = int;
};

// Decode (T <= 8): the weights are the M side of the mma (16 rows: lane group g reads rows g and
// g + 8 of a tile), the step's pairs of one expert the N side (8 columns), so one mma.sync serves
// 16 rows; KS warps split the input dimension; each lane keeps D chunks of weights in flight.
// PH 0 tiles pair gate row j (row g) with up row j (row g + 8), so a lane holds both for its j.
//
// The kernel's shape, per decoder (optional `using RegisterShape = RegisterShape<...>;`):
//   NT         16-row tiles per warp (0: 2 for 8 values per 16 bytes, bf16 decoding for free; else 1)
//   D          chunks in flight per lane (0: 3 for 16 values per 16 bytes, else 2)
//   XRing      x loaded with the weights, D chunks ahead, or (false) when its chunk is consumed:
//              x stays in L1 (the weights bypass it), and at T=1 only 4 lanes of 32 use x
//   MaxRegs    registers per lane (__maxnreg__): 128 holds 16 warps per SM, 96 20, 80 24, 64 32
//   ScaleRing  chunk-scaled decoders: the chunk scales loaded with the weights (else at use)
//   L2Bytes    the weight loads' L2 prefetch size (0, 128, 256; read by the decoder's load)
//   Pdl        phase 1 launched as a programmatic dependent of phase 0: its blocks start while
//              phase 0's last blocks run, put their first D chunks of weights in flight, and
//              wait for phase 0 (act, the cleared out) before the first x is read
template <int NT_ = 0, int D_ = 0, bool XRing_ = true, int MaxRegs_ = 128, bool ScaleRing_ = false, int L2Bytes_ = 0,
          bool Pdl_ = false>
struct RegisterShape {
    static constexpr int NT = NT_, D = D_, MaxRegs = MaxRegs_, L2Bytes = L2Bytes_;
    static constexpr bool XRing = XRing_, ScaleRing = ScaleRing_, Pdl = Pdl_;
};

// A decoder without a RegisterShape runs the legacy loop (Legacy) with the default shape.
template <class Dec>
struct RegisterShapeOf {
    template <class D>
    static typename D::RegisterShape test(int);
    template <class D>
    static void test(...);
    static constexpr bool Legacy = std::is_void_v<decltype(test<Dec>(0))>;
    using S = std::conditional_t<Legacy, RegisterShape<>, decltype(test<Dec>(0))>;
    static constexpr int NT = S::NT ? S::NT : (Dec::VEC == 8 ? 2 : 1);
    static constexpr int D = S::D ? S::D : (Dec::VEC == 16 ? 3 : 2);
    static constexpr int MaxRegs = S::MaxRegs;
    static constexpr bool XRing = S::XRing, ScaleRing = S::ScaleRing && HasChunkScale<Dec>::value, Pdl = S::Pdl;
};

// The legacy loop: x in the ring, scales at use, loads predicated (decoders without a
// RegisterShape; FTW_CUDA_REGISTER_SHAPE=legacy for the others).
template <class Dec, int PH, int NT>
__device__ __forceinline__ void decode_expert_legacy(const KernelParams& p, const Tile& tile,
                                                     float (&acc)[NT][4], typename Dec::Row (&row)[NT][2],
                                                     bool (&rok)[NT][2], typename ChunkRowOf<Dec>::type (&crow)[NT][2],
                                                     const __nv_bfloat16* xrow) {
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;
    constexpr int NX = NR / 4;
    constexpr int D = RegisterShapeOf<Dec>::D;
    constexpr bool CS = HasChunkScale<Dec>::value;
    const int KS = blockDim.x / 32;
    const int ks = threadIdx.x >> 5, lane = threadIdx.x & 31, tig = lane & 3;
    const int in = PH == 0 ? p.H : p.I;
    const int nunits = in / V;
    const int nchunks = (nunits + 3) >> 2;
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
                    const float s0 = Dec::chunk_scale(p, PH, crow[n][0], c);
                    const float s1 = Dec::chunk_scale(p, PH, crow[n][1], c);
                    acc[n][0] += part[0] * s0, acc[n][1] += part[1] * s0;
                    acc[n][2] += part[2] * s1, acc[n][3] += part[3] * s1;
                }
            }
        }
    }
}

// A lane's rows of one expert in experts_decode and its ring of D chunks in flight (registers):
// set by prime (rows, then the first D chunks' weights and ScaleRing's scales) either in
// decode_expert or, with early weights, before the block's routing (experts_decode).
template <class Dec, int PH, int NT>
struct DecodeLane {
    using Shape = RegisterShapeOf<Dec>;
    static constexpr int V = Dec::VEC, NR = V / 2, NX = NR / 4, D = Shape::D;
    static constexpr bool CS = HasChunkScale<Dec>::value, SR = Shape::ScaleRing;
    // Tile n's row h takes the chunk scale of tile sn(n)'s row sh(h) where the decoder says
    // they share it: phase 0's 8 NT gate (and up) rows of a block, phase 1's 16 NT rows.
    static constexpr int SHR = ScaleRowsOf<Dec>::value;
    static constexpr bool share_n = PH == 0 ? SHR % (8 * NT) == 0 : SHR % (16 * NT) == 0;
    static constexpr bool share_h = PH == 1 && share_n;
    using ChunkRow = typename ChunkRowOf<Dec>::type;
    // A stage: one chunk's weight units of every row of the lane, and what XRing / ScaleRing
    // load with them (unused members cost no registers).
    struct Stage {
        typename Dec::Raw w[NT][2];
        uint4 x[NX];
        float s[NT][2];
    };
    typename Dec::Row row[NT][2];
    bool rok[NT][2];
    ChunkRow crow[NT][2];  // chunk scales of the rows, clamped in range (rows past the end)
    Stage ring[D];
    int slot, nunits, nchunks;

    __device__ __forceinline__ void set_rows(const KernelParams& p, int s) {
        const int g = (threadIdx.x & 31) >> 2;
        slot = s;
        nunits = (PH == 0 ? p.H : p.I) / V;
        nchunks = (nunits + 3) >> 2;
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
                row[n][h] = Dec::row(p, PH, slot, rok[n][h] ? r : 0);
                if constexpr (CS) crow[n][h] = Dec::chunk_row(p, PH, slot, rok[n][h] ? r : 0);
            }
    }
    // Weight loads need no predicate: rows past the matrix read row 0 (clamped above) and
    // their sums are dropped; units past the row (a partial last chunk, or a refill past the
    // last chunk) read the row's last unit, which meets zero x or is never used.
    __device__ __forceinline__ void fetch_tile(int c, int n, Stage& st) const {
        const int u = min(c * 4 + int(threadIdx.x & 3), nunits - 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) st.w[n][h] = Dec::load(row[n][h], u);
    }
    __device__ __forceinline__ float chunk_scale(const KernelParams& p, int n, int h, int c) const {
        if constexpr (CS)
            return Dec::chunk_scale(p, PH, crow[share_n ? 0 : n][share_h ? 0 : h], c);
        else
            return 0.f;
    }
    __device__ __forceinline__ void fetch_scales(const KernelParams& p, int c, Stage& st) const {
        if constexpr (SR) {
            const int cc = c < nchunks ? c : 0;  // a chunk past the row: any scale in range
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    st.s[n][h] = (n > 0 && share_n) || (h > 0 && share_h) ? 0.f : chunk_scale(p, n, h, cc);
        }
    }
    // The rows of `s`, and the weights (and ScaleRing's scales) of the warp's first D chunks in
    // flight; x (XRing) is left to decode_expert, which knows the pairs.
    __device__ __forceinline__ void prime(const KernelParams& p, int s) {
        const int KS = blockDim.x / 32, ks = threadIdx.x >> 5;
        set_rows(p, s);
#pragma unroll
        for (int d = 0; d < D; ++d) {
            fetch_scales(p, ks + d * KS, ring[d]);
#pragma unroll
            for (int n = 0; n < NT; ++n) fetch_tile(ks + d * KS, n, ring[d]);
        }
    }
};

// One expert's share of a decode step: this block's rows of the expert in `tile`, every pair.
// primed: `lane` already holds the rows of tile.slot and its first D chunks (DecodeLane::prime).
template <class Dec, int PH, int NT, bool Legacy>
__device__ __forceinline__ void decode_expert(const KernelParams& p, const Tile& tile,
                                              float (&red)[kMaxKSplit - 1][NT * 4][32], DecodeLane<Dec, PH, NT>& lane,
                                              bool primed) {
    using Shape = RegisterShapeOf<Dec>;
    using Lane = DecodeLane<Dec, PH, NT>;
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;  // bf16x2 registers per 16-byte unit
    constexpr int NX = NR / 4;  // 16-byte loads of x per unit
    constexpr int D = Shape::D;
    constexpr bool CS = HasChunkScale<Dec>::value;
    constexpr bool XR = Shape::XRing, SR = Shape::ScaleRing;
    const int KS = blockDim.x / 32;
    const int slot = tile.slot;
    const int ks = threadIdx.x >> 5, lane_id = threadIdx.x & 31, g = lane_id >> 2, tig = lane_id & 3;
    if (!primed) lane.set_rows(p, slot);
    const int nunits = lane.nunits;
    const int nchunks = lane.nchunks;
    auto& row = lane.row;
    auto& rok = lane.rok;
    auto& crow = lane.crow;
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

    if constexpr (Legacy) {
        decode_expert_legacy<Dec, PH, NT>(p, tile, acc, row, rok, crow, xrow);
    } else {
        using Stage = typename Lane::Stage;
        auto& ring = lane.ring;
        auto load_x = [&](int c, uint4 (&x)[NX]) {
            const int u = c * 4 + tig;
            const uint4* src = reinterpret_cast<const uint4*>(xrow + int64_t(u) * V);
#pragma unroll
            for (int i = 0; i < NX; ++i) x[i] = (xrow != nullptr && u < nunits) ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
        };
        auto fetch_tile = [&](int c, int n, Stage& st) { lane.fetch_tile(c, n, st); };
        auto chunk_scale = [&](int n, int h, int c) { return lane.chunk_scale(p, n, h, c); };
        auto fetch_side = [&](int c, Stage& st) {
            if constexpr (XR) load_x(c, st.x);
            lane.fetch_scales(p, c, st);
        };
        constexpr bool share_n = Lane::share_n, share_h = Lane::share_h;
        auto stage_scale = [&](const float (&sc)[NT][2], int n, int h) { return sc[share_n ? 0 : n][share_h ? 0 : h]; };
        // phase 1 of a programmatic launch: phase 0 complete (act written) before x is read
        auto wait_phase0 = [] {
            if constexpr (PH == 1 && Shape::Pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
        };
        if (primed) {  // the weights are in flight: x, once phase 0 is complete
            wait_phase0();
            if constexpr (XR) {
#pragma unroll
                for (int d = 0; d < D; ++d) load_x(ks + d * KS, ring[d].x);
            }
        } else {
            if constexpr (XR) wait_phase0();
#pragma unroll
            for (int d = 0; d < D; ++d) {
                fetch_side(ks + d * KS, ring[d]);
#pragma unroll
                for (int n = 0; n < NT; ++n) fetch_tile(ks + d * KS, n, ring[d]);
            }
            if constexpr (!XR) wait_phase0();
        }

        for (int c0 = ks; c0 < nchunks; c0 += D * KS) {
#pragma unroll
            for (int d = 0; d < D; ++d) {
                const int c = c0 + d * KS;
                if (c >= nchunks) break;  // warp-uniform
                const int cn = c + D * KS;  // the chunk that refills stage d
                uint4 xv[NX];
                float sc[NT][2];
                if constexpr (XR) {
#pragma unroll
                    for (int i = 0; i < NX; ++i) xv[i] = ring[d].x[i];
                } else {
                    load_x(c, xv);  // an L1 hit, in flight while the weights decode
                }
                if constexpr (SR) {
#pragma unroll
                    for (int n = 0; n < NT; ++n) sc[n][0] = ring[d].s[n][0], sc[n][1] = ring[d].s[n][1];
                }
                fetch_side(cn, ring[d]);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    uint32_t wa[NR], wb[NR];
                    Dec::decode(ring[d].w[n][0], wa);
                    Dec::decode(ring[d].w[n][1], wb);
                    fetch_tile(cn, n, ring[d]);  // tile n's units of stage d are decoded: refill them
                    uint32_t xr[NR], xa[NR];
#pragma unroll
                    for (int i = 0; i < NX; ++i)
                        xr[4 * i] = xv[i].x, xr[4 * i + 1] = xv[i].y, xr[4 * i + 2] = xv[i].z, xr[4 * i + 3] = xv[i].w;
                    Dec::permute(xr, xa);
                    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int s = 0; s < V / 4; ++s)
                        mma_bf16(CS ? part : acc[n], wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1], xa[2 * s],
                                 xa[2 * s + 1]);
                    if constexpr (CS) {
                        const float s0 = SR ? stage_scale(sc, n, 0) : chunk_scale(n, 0, c);
                        const float s1 = SR ? stage_scale(sc, n, 1) : chunk_scale(n, 1, c);
                        acc[n][0] += part[0] * s0, acc[n][1] += part[1] * s0;
                        acc[n][2] += part[2] * s1, acc[n][3] += part[3] * s1;
                    }
                }
            }
        }
    }

    if (KS > 1 && ks > 0) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[ks - 1][n * 4 + i][lane_id] = acc[n][i];
    }
    __syncthreads();
    if (ks == 0) {
        for (int k = 0; k < KS - 1; ++k)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[n][i] += red[k][n * 4 + i][lane_id];

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
// Early (early_weights()): block row y < K's first distinct expert is token 0's k = y (a token
// lists an expert once), known without the routing: the block puts its first D chunks of that
// expert's weights in flight first, then clears out and routes while they arrive. The routing
// still decides: a block whose expert turns out otherwise (a token listing an expert twice, which
// only an unchecked step can pass) drops them and primes again.
template <class Dec, int PH, int NT, bool Legacy, bool Early = false>
__global__ void __launch_bounds__(kMaxKSplit * 32) __maxnreg__(RegisterShapeOf<Dec>::MaxRegs) experts_decode(const KernelParams p) {
    static_assert(!(Early && Legacy), "early weights prime the shaped loop's ring");
    __shared__ int s_ids[kDecodeMaxPairs], s_first[kDecodeMaxPairs], s_dexp[kDecodeMaxPairs], s_pairs[8], s_meta[2];
    __shared__ float red[kMaxKSplit - 1][NT * 4][32];  // K-split partials, summed into warp 0
    DecodeLane<Dec, PH, NT> lane;
    bool primed = false;  // block-uniform
    if (PH == 0) phase0_wait();
    if constexpr (Early) {
        if (int(blockIdx.y) < p.K) {
            const int e = p.topk_ids[blockIdx.y];
            const int s = e >= 0 && e < p.num_experts ? p.slot_of_expert[e] : -1;
            if (s >= 0 && s < p.num_slots) lane.prime(p, s), primed = true;
        }
    }
    if (PH == 0) {  // phase 1 adds into out: clear it here, before any block leaves
        const int64_t n = int64_t(p.T) * p.H, stride = int64_t(gridDim.x) * gridDim.y * blockDim.x;
        for (int64_t i = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
            p.out[i] = 0.f;
    }
    const int nexp = decode_experts<PH>(p, s_ids, s_first, s_dexp, s_meta);
    // phase 0: phase 1's blocks may start (Pdl); phase 1: the next step's phase 0's (phase0_wait)
    if ((PH == 0 && RegisterShapeOf<Dec>::Pdl) || PH == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int dx = blockIdx.y; dx < nexp; dx += gridDim.y) {  // block-uniform
        const Tile tile = decode_tile(p, s_dexp[dx], s_ids, s_pairs);
        const bool ready = primed && tile.slot == lane.slot;  // only the first expert was primed
        primed = false;
        if (tile.count == 0) continue;
        decode_expert<Dec, PH, NT, Legacy>(p, tile, red, lane, ready);
        __syncthreads();  // s_pairs and red are rewritten for the next expert
    }
}

// ---- staged decode (decoders with kStaged) ---------------------------------------------------
//
// experts_decode above keeps its weight units in flight in registers (2-3 per lane, ~32-64 KB
// per SM) and reads 64 bytes per row per load instruction, so the L2 sees twice the requests of
// full 128-byte lines (ncu, H200, deepseek-v3 size: bf16 phase 0 at 85% of L2 throughput for 73%
// of DRAM). This kernel stages the weights through shared memory instead:
// - each warp owns a ring of S stages; a stage is one chunk of a 16-row tile: 8 units (128
//   bytes) of every row, 2 KB. The warp fills it with cp.async (16 bytes per lane, L2 only, with
//   a 256-byte L2 prefetch), 8 lanes per row, so each load instruction reads 4 full 128-byte
//   lines; stage d of chunk f is refilled with chunk f + S right after it is consumed;
// - the lanes then read their mma fragments' units (rows g and g + 8, units tig and tig + 4)
//   back from shared memory (units XOR-swizzled by row parity: no bank conflicts either way) and
//   decode them as experts_decode does; the units' scales (Side) and fp8_block's chunk scales
//   are loaded into registers when the stage is issued, S chunks ahead;
// - blocks are persistent: the grid is what fits on the GPU at once; a block routes the step
//   once, then serves items (expert, 16-row band) blockIdx.x, + gridDim.x, ...; its KS warps
//   split an item's chunks into contiguous runs of cpw, the ring running on across items, so the
//   next item's loads are in flight while this one is reduced (shared memory, warp 0) and stored.
//   Phase 1 may also split an item's chunks into nparts parts, each an item of its own (down
//   adds into out: each part adds its share, the first one the bias; launch_staged decides).
// Units past the row's end and rows past the matrix are zero-filled by the copy, so partial
// chunks need no masking in the math.
//
// Optional decoder interface, on top of the contract above (detected like kChunkScale):
//   kStaged                       present: the decoder can run here; true: decode uses this
//                                 kernel by default, false: experts_decode stays its default
//   weights(p, proj, slot)        the slot's weight matrix: rows of weight_row_bytes(p, proj)
//   weight_row_bytes(p, proj)     bytes, each a run of 16-byte units (copied by cp.async)
//   Side                          the register part of a unit (its scales; empty when none)
//   Side side(row, u)             the rest of unit u of a row (Side{} must decode zeros to 0)
//   Raw raw(uint4 w, Side s)      the Raw that load(row, u) would have returned
// Byte-stream rows (gguf: blocks of 17..210 bytes, not 16-byte units) replace Side, side and raw
// with (detected by kChunkBytes):
//   kChunkBytes                   bytes of a row per chunk (8 units, 256 values: whole blocks)
//   kSpan                         16-byte pieces that cover a chunk wherever it starts in a row
//   decode_staged(b, k, w)        decode unit k (0..7) of the chunk whose first byte is at b (in
//                                 shared memory; b has the chunk's global address mod 16)
// Each row's chunk is staged as the aligned 16-byte pieces covering its bytes (a row's pieces at
// an odd pitch of 16-byte units: conflict-free reads across the 8 row groups); the decoder reads
// its scales from there too. Every piece holds a byte of the row, so nothing past the aligned
// 16 bytes holding a bank's last byte is read.
// A decoder without the interface keeps experts_decode. FTW_CUDA_DECODE=classic / =staged
// overrides the default for every decoder that has it (benchmarks).
FTW_HAS_MEMBER(HasStaged, kStaged);
// kShortRing (optional, byte streams): rings of 2 stages by default, as the wide chunks have
// (launch_decode; gguf's 4-bit types of 32-value blocks and IQ4_XS)
FTW_OPTIONAL_MEMBER(ShortRing, kShortRing, bool, false);
FTW_OPTIONAL_MEMBER(StagedPreferred, kStaged, bool, false);  // (also gguf's Fast<T>::kStaged)
template <class Dec>
struct Staged {
    static constexpr bool available = HasStaged<Dec>::value;
    static constexpr bool preferred = StagedPreferred<Dec>::value;
};

// 16 bytes global -> shared, L2 only; bytes = 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// 16 bytes from shared memory (volatile: kept after the cp.async wait it follows)
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
// 8 and 4 bytes from shared memory, as ld_shared_v4
__device__ __forceinline__ uint2 ld_shared_v2(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

// The step's routing, once per block: the distinct experts in order of first appearance, each
// with its slot (-1: out of range or not resident, skipped and flagged) and its pairs (<= 8).
struct StagedRouting {
    int ids[kDecodeMaxPairs];
    int slot[kDecodeMaxPairs];
    unsigned char first[kDecodeMaxPairs];  // index of the pair's expert's first appearance
    unsigned char pos[kDecodeMaxPairs];    // how many pairs before this one have its expert
    unsigned char rank[kDecodeMaxPairs];   // for a first appearance: its distinct-expert rank
    unsigned char count[kDecodeMaxPairs];  // per rank: pairs (at most 8)
    unsigned char pairs[kDecodeMaxPairs][8];
    int meta[2];  // distinct experts, first bad pair
};

template <int PH>
__device__ int staged_route(const KernelParams& p, StagedRouting& rt) {
    const int P = p.T * p.K, tid = threadIdx.x;
    if (tid == 0) rt.meta[0] = 0, rt.meta[1] = INT_MAX;
    for (int i = tid; i < P; i += blockDim.x) rt.ids[i] = p.topk_ids[i];
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        const int e = rt.ids[i];
        int first = i, pos = 0;
        for (int j = i - 1; j >= 0; --j)
            if (rt.ids[j] == e) first = j, ++pos;
        rt.first[i] = (unsigned char)first, rt.pos[i] = (unsigned char)pos;
        const int s = (e >= 0 && e < p.num_experts) ? p.slot_of_expert[e] : -1;
        if (s < 0 || s >= p.num_slots) atomicMin(&rt.meta[1], i);
        if (first == i) atomicAdd(&rt.meta[0], 1);
    }
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        if (rt.first[i] != i) continue;
        const int e = rt.ids[i];
        int rank = 0, n = 0;
        for (int j = 0; j < i; ++j) rank += rt.first[j] == j;
        for (int j = i; j < P; ++j) n += rt.ids[j] == e;
        rt.rank[i] = (unsigned char)rank;
        rt.count[rank] = (unsigned char)min(n, 8);  // more only if a token lists an expert twice (refused on the host)
        const int s = (e >= 0 && e < p.num_experts) ? p.slot_of_expert[e] : -1;
        rt.slot[rank] = (s >= 0 && s < p.num_slots) ? s : -1;
    }
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x)
        if (rt.pos[i] < 8) rt.pairs[rt.rank[rt.first[i]]][rt.pos[i]] = (unsigned char)i;
    __syncthreads();
    if (PH == 0 && blockIdx.x == 0 && tid == 0) *p.error = rt.meta[1] == INT_MAX ? 0 : rt.meta[1] + 1;
    return rt.meta[0];
}

FTW_HAS_MEMBER(ByteStream, kChunkBytes);

// A stage: 16 rows of kPitch 16-byte units; kCopy of them per row are copied (8 units of 16
// bytes, or a byte-stream chunk's covering pieces).
template <class Dec, bool B = ByteStream<Dec>::value>
struct StageShape {
    static constexpr int kCopy = 8, kPitch = 8, kUnits = 16 * kPitch;
};
template <class Dec>
struct StageShape<Dec, true> {
    static constexpr int kCopy = Dec::kSpan, kPitch = Dec::kSpan | 1, kUnits = 16 * kPitch;
};

// The register part of a unit (Side) where the decoder has one; byte streams have none.
template <class Dec, bool B = ByteStream<Dec>::value>
struct SideOf {
    using type = typename Dec::Side;
};
template <class Dec>
struct SideOf<Dec, true> {
    struct type {};
};

// Dynamic shared memory of the staged kernel: the rings [KS][S][16 rows][pitch] x 16 bytes,
// then the K-split partials [KS - 1][4][32] floats
// (tiles: 16-row tiles per stage, kOptRows32: the partials of each).
constexpr int staged_smem(int KS, int S, int units, int tiles = 1) {
    return KS * S * units * 16 + (KS - 1) * 4 * tiles * 32 * 4;
}

// Variants of the staged kernel (template OPT, bits; FTW_CUDA_STAGED_OPT picks one at launch so
// that a benchmark times them in one run; the default has every bit):
//   kOptDecode   the decoder's decode; without it, decoders that keep their previous decode as
//                decode_v0 run that (nvfp4, mxfp4, ds_fp4: the e2m1 shifts and float scales)
// Measured on the H200 and dropped (docs/BENCHMARKS.md, "fp4 decode by multiplies"): two
// accumulators per lane (two mma chains), the copies' sources as unsigned offsets, the units'
// scales copied with the weights into shared memory, 3 or 5 warps per block, 6 stages.
constexpr int kOptDecode = 1;
constexpr int kStagedOptAll = kOptDecode;
// 16-byte-unit rows only (nvfp4, mxfp4, ds_fp4, mxfp8; FTW_CUDA_STAGED_OPT picks, staged_unit_opt):
//   kOptLean     the producer's per-stage work cut to what changes per chunk: each lane's copy
//                sources kept per item with its unit's offset, one chunk offset and one bounds
//                check per stage for its 4 copies (was: 64-bit row addresses, two checks and a
//                select per copy), sides at a clamped unit (the unit past the row is zero-filled),
//                and the producer's and consumer's "chunk in the item" tests as one count per item
//   kOptActPerm  phase 0 stores act in the decoder's pair order (Dec::act_pos), so phase 1 loads
//                its x pairs as they are, without Dec::permute (decoders with act_pos; both phases
//                of a step run the same variant)
//   kOptWide     128 registers per lane (4 blocks of 4 warps per SM) instead of 96 (5); by default
//                only for rows of at least FTW_CUDA_STAGED_WIDE (24) chunks (staged_wide)
//   kOptRows32   a stage holds two 16-row tiles of a chunk (32 rows, 4 KB; an item is a band of
//                32 rows): each lane decodes rows g, g + 8, g + 16, g + 24 against one load and
//                permutation of x, and the producer's per-stage work serves twice the bytes; the
//                ring has 2 stages (8 KB per warp, as 4 of 16 rows), 128 registers (kOptWide);
//                where staged_rows32 says (FTW_CUDA_STAGED_ROWS32)
//   kOptEarly    a block's first item's first S chunks copied before the routing, where its
//                expert is known without it (FTW_CUDA_EARLY_WEIGHTS=1, with kOptLean; see the kernel)
//   kOptScale2   decoders with a decode_v1 (mxfp4, ds_fp4: the E8M0 scale pair by e8m0_bf16x2)
//                run their decode; without it, decode_v1 (FTW_CUDA_STAGED_SCALE2=0; the default
//                variants have it: launch_staged_scale2)
// Measured on the H200 and dropped (docs/BENCHMARKS.md, "E8M0 scale pairs"): phase 0's x copied
// by each block into shared memory in pair order once (no x loads from L1 and no PRMT per stage).
constexpr int kOptLean = 8, kOptActPerm = 16, kOptWide = 32, kOptRows32 = 64, kOptEarly = 128;
constexpr int kOptScale2 = 256;
//   kOptFine     finer work for phases of few items per SM (the qwen3-30b-a3b size, where each warp
//                otherwise gets one item of 3-4 chunks, all in flight at once, and decodes them only
//                after they arrive): a ring of 2 stages and the fewest warps per block (up to 4)
//                that give each warp at most 2 chunks of an item, so more warps per SM share the
//                decode while the others' bytes arrive: gate_up at 80 registers (6 blocks of 4 warps
//                per SM; at 96 only 5 fit, and qwen3's 768 items would take two rounds), down at 96
//                (at 80, 24 bytes spill) with parts of as few as 2 chunks at T = 1 (the ring's
//                stages: the parts rule's floor). qwen3 size, by the rules' arithmetic: fp4 gate_up 4
//                warps of 2 chunks (else 2 of 4), down 2 parts of 2 and 1 chunks; mxfp8 gate_up 4
//                warps of 4 (else 2 of 8), down 2 warps of 3 (else 1 of 6). Where
//                staged_fine says (mxfp8 at the qwen3-30b-a3b size)
constexpr int kOptFine = 512;
//   kOptUnitCols T = 1, decoders with the unit-columns interface (nvfp4, mxfp4, ds_fp4: kUnitGroups,
//                decode_raw, group_scales): the mma's 8 columns, idle but one at T = 1, hold the
//                sums of the units instead. In step s of a unit's 8 mma, the quad's lane tig gives
//                the A values of its own unit (tig + 4 j), unscaled (e2m1 * 2^-126: LOP3, IMAD,
//                LOP3 per bf16x2, no HMUL2), and the B lane (g, tig) gives x * 2^kUnitColsX only where
//                g = 2 tig (zeros elsewhere: lanes that never load x keep them), so column 2 tig
//                sums unit tig + 4 j alone (kUnitGroups = 2, nvfp4's two 16-value groups: the
//                second group's x from lane g = 2 tig + 1, so column 2 tig + 1 sums it, in the same
//                chain): lane (g, tig) holds its own unit's group sums of rows g and g + 8, and
//                applies the scale group_scales gives
//                (a float: the scale times 2^(64 - kUnitColsX), or the scale alone with that power of
//                2 on the item's sums, kUnitColsPost (nvfp4), so the sums come out as the decode's
//                w * x with w * 2^-62) by one FFMA per group and row and chunk where the decode
//                applied it by one HMUL2 per 2 values; the quad's 4 lanes are summed once per item
//                (shuffles). x times 2^kUnitColsX keeps the products of the unscaled weights
//                (>= 2^-127; the e2m1 0.5 is a bf16 subnormal, which the tensor cores take as it is:
//                tests/test_cuda_staged.py) away from float32's subnormals; phase 0 then stores act times
//                2^kUnitColsX (exact), so phase 1 loads it as it is (both phases of a step run it:
//                its choice, staged_unit_cols, does not depend on the phase). Exact in the same way
//                as the decode (bf16 products, float32 sums), for |x|, |act| < 2^71. SASS per stage
//                (E8M0, between the cp.async waits): 32-row phase 0 959 -> 866 instructions, phase 1
//                1007 -> 871; 16-row 566 -> 526, 587 -> 522. H200, T = 1 (docs/BENCHMARKS.md "FP4I"):
//                deepseek-v3 mxfp4 / ds_fp4 81.2 / 80.4 -> 75.9 / 75.1 us (0.55x -> 0.59x the
//                ceiling), qwen3-30b-a3b equal (19.4 -> 19.2, 18.7 -> 18.6); nvfp4 slower (its
//                kUnitColsDefault is false).
constexpr int kOptUnitCols = 1024;
constexpr int kUnitColsX = 57;  // (nvfp4's factor, e4m3 * 2^-120 placed into a float, times 2^(127): 2^127 at most)
constexpr uint32_t kUnitColsXBf16x2 = uint32_t(127 + kUnitColsX) << 23 | uint32_t(127 + kUnitColsX) << 7;
constexpr int kStagedUnitOpt = kOptDecode | kOptLean | kOptActPerm;
// Byte-stream rows only (gguf; FTW_CUDA_STAGED_BYTES=0 runs neither, byte_stream_opt):
//   kOptCopy32   each row's chunk copied as a 32-bit count of covering pieces (v < count per
//                copy, the source clamped to the row's last piece) instead of a 64-bit address
//                compared against the row's end and selected per copy
//   kOptFull     a chunk whose units all lie in the row decoded without the per-lane check
//                (a warp-uniform branch per chunk instead of one per unit and row: the stage's
//                decodes and mma chains are one block for the compiler to schedule)
// Measured on the H200 and dropped (docs/BENCHMARKS.md, "GGUF staged copies and full chunks"):
// two accumulators per lane, 3 blocks per SM (168 registers), a lane's units 2 tig and 2 tig + 1.
constexpr int kOptCopy32 = 2, kOptFull = 4;
//   kOptOneColumn  decoders on float32 sub-block sums of 32 values with mins (gguf Q4_K, Q5_K,
//                  Q8_0): an item of one pair (T = 1) runs a chunk body that updates only the
//                  accumulators of pair column 0 (staged_sub_block_chunk's ONE; 4 of 8 fma per
//                  sub-block and row pair), the others the full one; where staged_one_column says
constexpr int kOptOneColumn = 2048;  // (a bit of its own: kOptUnitCols is 1024)
//   kOptWholeCopy  decoders on float32 sums (kSubBlocks, kIntSums: every chunk is whole blocks
//                  inside the row) copy a chunk by the lane's piece address kept in the row
//                  pointer (pw[k] + 16 v, v = lane & 7) plus the chunk's byte offset, masked to
//                  16 bytes: no 64-bit end of row, no count of pieces; only a span's last piece
//                  may lie past the chunk (checked against the address's low 4 bits, the source
//                  then the piece before it, 0 bytes). SASS of the producer per stage (Q3_K,
//                  4 rows of one copy per lane): 77 -> 51 instructions (docs/BENCHMARKS.md "Q3";
//                  unless FTW_CUDA_STAGED_WHOLECOPY=0, staged_whole_copy; then the kOptCopy32 copies)
constexpr int kOptWholeCopy = 4096;
//   kOptLaneBlocks with kOptOneColumn, decoders with the lane-blocks interface (gguf Q4_K, Q5_K:
//                  kLaneBlocks): an item of one pair (T = 1) runs staged_sub_block_lanes instead of
//                  the one-column body: each lane of a quad decodes sub-blocks of its own (lane tig:
//                  2 tig and 2 tig + 1 of the chunk), and only the B lanes (2 tig, tig) supply x,
//                  the others zeros (lane_zeros), so the mma's column 2 tig sums lane tig's
//                  sub-blocks alone (kOptUnitCols' layout) and each lane applies the scales and mins
//                  of its 2 sub-blocks per row instead of all 8; the quad's lanes are summed once
//                  per item (shuffles). Where staged_lane_blocks says (Q4_K, Q5_K at T = 1), with
//                  kOptLaneCols but for FTW_CUDA_STAGED_LANES=1
constexpr int kOptLaneBlocks = 8192;
//   kOptLaneCols   with kOptLaneBlocks: lane tig's two sub-blocks in columns 2 tig and 2 tig + 1
//                  (staged_sub_block_lane_cols: one X chain for both, one x load per step pair)
constexpr int kOptLaneCols = 16384;
//   kOptByteCols   T = 1, byte-stream decoders with the byte-columns interface (gguf Q4_0, MXFP4:
//                  kByteCols, decode_cols): kOptUnitCols' layout for their 32-value units. Lane
//                  (g, tig) decodes its units tig + 4 j of rows g and g + 8 unscaled (Q4_0: q - 8,
//                  MXFP4: e2m1 * 2^-126), only the B lane (2 tig, tig) gives the unit's x (times
//                  2^kUnitColsX where kByteColsX), the others zeros, so column 2 tig of the unit's
//                  mma chain sums that unit alone; then one FFMA per row applies the unit's scale
//                  (decode_cols' float, the decoder's post and x's 2^kUnitColsX folded in) where the
//                  decode multiplied every pair (HMUL2), and the quad's lanes are summed once per
//                  item (kOptUnitCols' shuffles). SASS (sm_90, the 2-stage kernels): Q4_0 phase 0
//                  4104 -> 3896 instructions, phase 1 4200 -> 4024; MXFP4 4512 -> 4424, 4608 -> 4504.
//                  Where the decoder's byte_cols says (launch_byte_stream, rings of 2 stages); H200,
//                  T = 1, deepseek-v3 (docs/BENCHMARKS.md "UC4"): Q4_0 87.7 -> 84.9 us, MXFP4 102.8
//                  -> 101.8. Measured and dropped (commit 5a41aa6 has the code): values with an
//                  offset (Q4_0 128 + q, IQ4_NL / IQ4_XS (level + 128) * 2^-133) taken off by 8 more
//                  mma per unit of the offset pair against x: Q4_0 87.9 -> 91.2 us, IQ4_NL staged
//                  117.6 -> 125.0, IQ4_XS 114.2 -> 118.4
constexpr int kOptByteCols = 32768;
//   kOptLanes16    decoders of 16-value sub-blocks with the lane-blocks interface for them (gguf
//                  Q6_K, Q2_K: kLanes16): an item of one pair (T = 1) runs staged_sub_block_lanes16
//                  instead of the full body: lane tig of a quad decodes the 4 sub-blocks of its own
//                  (the chunk's values 128 (tig / 2) + 32 s + 16 (tig % 2) .., s = 0..3) in
//                  kOptLaneCols' two columns, and applies 4 scales (and mins) per row on float32
//                  sums, where Q6_K's full body takes 16 scales in every lane for 4 columns and
//                  Q2_K's (wide lanes) puts a scale into every pair by a bf16 fma; the quad's lanes
//                  summed per item as kOptLaneBlocks'. SASS per chunk (phase 0): Q6_K 522 -> 360,
//                  Q2_K 409 -> 248. Where staged_lanes16 says (T = 1)
constexpr int kOptLanes16 = 262144;
//   kOptInt8       T = 1, byte-stream decoders with the int8 interface (gguf Q4_0, MXFP4,
//                  IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S: kInt8, decode_int8; the IQ3 grids in shared memory,
//                  docs/BENCHMARKS.md "IQ3 int8"; IQ2_XXS, IQ2_XS on their sums with the grid
//                  in copies, IQ2_XS a scale per 16 values: kInt8Halves): each weight is a small integer times its
//                  unit's scale, so the units go to mma.m16n8k32 u8 x s8 (s32 sums) as integers and x
//                  as two int8 planes per 32-value group j (quantize_int8, a launch before the phase
//                  that the phase waits on: x = s_j (hi + lo / 254), within s_j / 508), in kOptByteCols'
//                  layout: lane (g, tig) decodes its unit tig + 4 j of rows g and g + 8 into the A
//                  fragment (a0 / a2: row g, k 4 tig .. and 16 + 4 tig ..; a1 / a3 row g + 8), the B
//                  lane (2 tig, tig) gives the group's hi, (2 tig + 1, tig) its lo, every other lane
//                  zeros, so columns 2 tig and 2 tig + 1 sum lane tig's unit against hi and lo: 4 IMMA
//                  per unit (the bf16 mma takes 8), then 254 S_hi + S_lo - offset * (254 sum hi + sum
//                  lo) (the decoder's u8 bias: Q4_0 8, the tables 128) in int32, one I2F and one FFMA
//                  per row by the unit's scale times s_j / 254; the quad's lanes summed per item.
//                  Where the decoder's int8 says (launch_byte_stream; FTW_GGUF_CUDA_INT8). SASS (sm_90,
//                  2-stage kernels, instructions per ring stage): Q4_0 phase 0 772 (kOptByteCols) ->
//                  505, phase 1 789 -> 528; MXFP4 1062 -> 851, 1068 -> 881; IQ4_NL 1129 -> 771 (its
//                  staged bf16 kernel), 1132 -> 799; IQ4_XS 1193 -> 749, 1163 -> 768. H200, T = 1, both
//                  phases (docs/BENCHMARKS.md "I8"): deepseek-v3 Q4_0 84.8 -> 77.1 us, MXFP4 102.3 ->
//                  93.4, IQ4_NL 114.8 -> 89.2, IQ4_XS 105.8 -> 86.2; qwen3-30b-a3b slower (18.5 -> 20.7,
//                  19.0 -> 23.8, 20.7 -> 23.2, 19.3 -> 21.8)
constexpr int kOptInt8 = 65536;
//   kOptInt8Sums   with kOptLaneBlocks, T = 1, phase 0, decoders of 32-value sub-blocks with mins and
//                  the int8 lane interface (gguf Q4_K, Q5_K: kInt8Sums): every weight is d sc q -
//                  dmin m with q an exact integer (0..15, 0..31), so lane tig's sub-blocks 2 tig + e
//                  (the lane-blocks assignment) go to mma.m16n8k32 u8 x s8 as their q against x's
//                  32-value group of each (kOptInt8's quantize_int8, non-interleaved): the B lanes
//                  (2 tig, tig) give the group's hi, (2 tig + 1, tig) its lo, so columns 2 tig and
//                  2 tig + 1 sum lane tig's sub-block alone: 4 IMMA per sub-block for both rows (the
//                  lane-cols body's bf16 mma: 8 and 4 for the sums of x); then per row and sub-block
//                  254 S_hi + S_lo in int32, one I2F, and (s / 254) (d sc I - dmin m X) with X the
//                  group's 254 sum(hi) + sum(lo) (staged_sub_block_int8). Where the decoder's int8
//                  says (launch_byte_stream; FTW_GGUF_CUDA_INT8, Fast<Q5_K>::kInt8Default). SASS per
//                  chunk body (sm_90): Q4_K 230 -> 146-150 (HMMA 24 -> IMMA 8), Q5_K 301 -> 233-238;
//                  H200 T = 1 (docs/BENCHMARKS.md "I8K"): deepseek-v3 Q4_K 80.0 -> 78.8 us, Q5_K 95.9
//                  -> 95.1; qwen3-30b-a3b Q4_K 19.5 -> 19.9, Q5_K 23.5 -> 22.9. With kOptLanes16 (gguf
//                  Q2_K: kInt8Mins16, both phases): lane tig's 32-value units 2 tig + e as u8 sc q (the
//                  16-value sub-blocks' scales in the integers), the mins by a second IMMA chain;
//                  SASS (phase 0 kernel) 3346 -> 3270, chunk body 248 -> ~215; H200 T = 1 ("Q2"):
//                  deepseek-v3 71.7 -> 62.8 us (0.40 -> 0.46), qwen3-30b-a3b 17.8 -> 18.1
constexpr int kOptInt8Sums = 524288;
//   kOptInt8Tokens T = 2..8, byte-stream decoders with the int8-tokens interface (gguf Q4_0,
//                  IQ4_NL, IQ4_XS: kInt8Tokens): a unit per quad, the IMMA's columns the item's pairs (I8T's layout,
//                  docs/BENCHMARKS.md "I8T") with T = 1's economy where I8T lost it: each lane
//                  reads its rows g and g + 8 of the chunk as 9 16-byte LDS each (rows of a chunk
//                  on a 16-byte boundary in the ring: int8_tokens_row), and picks its quarter of
//                  every unit (a word) and every unit's scale from them in registers (no LDS per
//                  unit, no scale decoded from global memory); the weights as s8 (Q4_0: 16 (q - 8),
//                  IQ4_NL: its levels; so no offset and no x group sums); x (act) quantized per token (pair) and chunk
//                  of 256 values (quantize_int8_tokens: one scale per chunk, hi + lo / 254 as
//                  kOptInt8's), stored so that lane (g, tig)'s B words of a unit (hi and lo planes
//                  of pair g) are one 16-byte load; per unit two IMMA (hi, lo) and per C value one
//                  IMAD, one I2F and one FFMA by the row's unit scale; the pair's chunk scale once
//                  per chunk. Only where every chunk is whole (and, for Q4_0 / IQ4_NL, every row
//                  starts on a 16-byte boundary; IQ4_XS's 136-byte chunks are read from wherever they
//                  start, 8-byte aligned: LDS.64 of the head and an LDS.32 per unit) (the decoder's
//                  int8_tokens_rows: the kernel has no other body). Where
//                  int8_tokens_for says (FTW_GGUF_CUDA_INT8_T8; unset: in many-item phases)
constexpr int kOptInt8Tokens = 1048576;
// Every kOpt is a bit of its own: two branches that took the same bit merged cleanly twice and
// made kernels read as others (kOptOneColumn / kOptUnitCols; FP4J's 20-warp down / kOptLaneBlocks)
constexpr int kOptBits[] = {kOptDecode,   kOptCopy32,    kOptFull,      kOptLean,       kOptActPerm, kOptWide,
                            kOptRows32,   kOptEarly,     kOptScale2,    kOptFine,       kOptUnitCols, kOptOneColumn,
                            kOptWholeCopy, kOptLaneBlocks, kOptLaneCols, kOptByteCols, kOptLanes16, kOptInt8,
                            kOptInt8Sums, kOptInt8Tokens};
constexpr bool opt_bits_distinct() {
    int seen = 0;
    for (int b : kOptBits) {
        if (b == 0 || (b & (b - 1)) != 0 || (seen & b) != 0) return false;
        seen |= b;
    }
    return true;
}
static_assert(opt_bits_distinct(), "each kOpt takes a bit no other kOpt has");
// Measured on the H200 and dropped for Q8_0 on block sums (docs/BENCHMARKS.md "Q8", commit 62a579b
// has the code): each lane's bytes of a stage's chunk read into registers (40 per lane) and the
// stage refilled before the chunk's decode, so both stages of the ring stay in flight (T=1, x the
// ceiling: deepseek-v3 0.64 -> 0.61 with the one-column body alone, 0.55 with the full one;
// qwen3-30b-a3b 0.42 -> 0.38), and with it an L2 bulk prefetch of each row 1, 2 or 4 chunks past
// the one a stage copies (deepseek-v3 0.61 -> 0.49-0.50).

FTW_HAS_MEMBER(HasDecodeV0, decode_v0);
FTW_HAS_MEMBER(HasDecodeV1, decode_v1);
FTW_HAS_MEMBER(HasActPos, act_pos);
FTW_HAS_MEMBER(HasUnitCols, kUnitGroups);
FTW_OPTIONAL_MEMBER(UnitGroups, kUnitGroups, int, 1);
// kOptUnitCols: a power of 2 on the item's row sums, the part of the decode's scale that the
// decoder's group_scales leaves out (nvfp4: 2^(64 - kUnitColsX); 1: none)
FTW_OPTIONAL_MEMBER(UnitColsPost, kUnitColsPost, float, 1.f);
// kOptByteCols' interface (optional, on top of the byte-stream one; kByteCols true):
//   float decode_cols(b, k, w[16])      unit k of the chunk at b unscaled, in decode_staged's pair
//                                       order; returns the unit's scale, so that the unit's share of
//                                       the decode's sum is scale * w . x
//   kByteColsX (optional, false)        x times 2^kUnitColsX in the mma (values near 2^-126: their
//                                       products kept off float32's subnormals)
//   static bool byte_cols(p)            (host) whether a launch takes kOptByteCols (T = 1 only)
FTW_OPTIONAL_MEMBER(ByteCols, kByteCols, bool, false);
FTW_OPTIONAL_MEMBER(ByteColsX, kByteColsX, bool, false);
// kOptInt8's interface (optional, on top of the byte-stream one; kInt8 true):
//   float decode_int8(b, k, a[8])       unit k of the chunk at b as u8 integers: a[2 s] the A words
//                                       a0 / a1 of IMMA step s (k 4 tig ..), a[2 s + 1] a2 / a3 (k 16 +
//                                       4 tig ..); returns the unit's scale, so that its share of the
//                                       decode's sum is scale * (a - kInt8Offset) . x
//   kInt8Offset                         the integers' bias (taken off through the x group's sum)
//   kInt8Interleaved (optional, false)  x's order in a group: false, a[2 s] takes values 4 s .. 4 s + 3
//                                       and a[2 s + 1] 16 + 4 s ..; true, a[2 s] values 4 s, 16 + 4 s,
//                                       4 s + 1, 17 + 4 s and a[2 s + 1] 4 s + 2, 18 + 4 s, 4 s + 3,
//                                       19 + 4 s (the nibble order of a unit's word s: gguf's tables)
//   static bool int8(p, phase)          (host) whether the phase of a launch takes kOptInt8 (T = 1 only)
FTW_OPTIONAL_MEMBER(Int8Cols, kInt8, bool, false);
FTW_OPTIONAL_MEMBER(Int8Interleaved, kInt8Interleaved, bool, false);
FTW_OPTIONAL_MEMBER(Int8Offset, kInt8Offset, int, 0);
// kInt8Only (optional, false): the decoder is launched only where its phase takes kOptInt8 (gguf's
// Int8TableRows), so launch_decode makes its int8 kernel alone
FTW_OPTIONAL_MEMBER(Int8Only, kInt8Only, bool, false);
//   kInt8Halves (optional, false)       a scale per 16 values (gguf IQ2_XS): float decode_int8_halves(b,
//                                       k, a[8], f[2]) instead, the values as s8 (no offset), returning
//                                       the unit's scale and in f the halves' integer factors (values
//                                       0..15, 16..31: a unit's share is scale * (f0 a0 . x0 + f1 a1 . x1));
//                                       two IMMA chains per unit, one per half
FTW_OPTIONAL_MEMBER(Int8Halves, kInt8Halves, bool, false);
// kOptInt8Tokens' interface (optional, on top of the byte-stream one; kInt8Tokens true), for rows
// whose chunks are all whole and lie where the decoder's row read takes them (static bool
// int8_tokens_rows(in), host: rows of `in` values are so on a 16-byte-aligned bank, the only banks
// the typed decoders run on; a chunk of kChunkBytes % 16 == 0 then starts on a 16-byte boundary):
//   f = int8_tokens_row(row, tig, a[8], d[8])  row: the shared address of the row's chunk; lane tig's
//                                       word of each of the chunk's 8 units (the unit's values at k
//                                       4 tig .. 4 tig + 3 and 16 + 4 tig .. of its IMMA, still packed)
//                                       and each unit's scale, the row's chunk factor f on all of them
//                                       (1 where the units' scales hold it all; times whatever
//                                       int8_tokens_split's integers leave out). With
//                                       kInt8TokensIntScales the scales are integers, int ls[8]
//                                       (|ls| <= 32: the body sums the units' hi and lo planes
//                                       times ls in int32, 8 IMAD per unit where float scales take
//                                       4 IMAD, 4 I2F and 4 FFMA)
//   int8_tokens_split(w, lo, hi)        the word as the two s8 A words (k 4 tig .., k 16 + 4 tig ..)
//   int8_tokens_slot(u, v)              (host and device) where value v (0..31) of the chunk's unit
//                                       u sits: 4 tig + j for the A word lo's byte j of lane tig, or
//                                       16 + 4 tig + j for hi's (quantize_int8_tokens stores x so)
FTW_OPTIONAL_MEMBER(Int8Tokens, kInt8Tokens, bool, false);
FTW_OPTIONAL_MEMBER(Int8TokensIntScales, kInt8TokensIntScales, bool, false);
// kOptInt8Sums' interface (optional, on top of the lane-blocks one; kInt8Sums true):
//   decode_lane_int8(b, tig, a[2][8])   sub-block 2 tig + e's quants as u8 into a[e], values 4 i ..
//                                       4 i + 3 in a[e][i] (IMMA step i / 2's A word of k 4 tig .. for
//                                       i even, of k 16 + 4 tig .. for i odd: each step's B words are
//                                       8 consecutive bytes of x's group, as quantize_int8 stores it
//                                       non-interleaved), each value q or q times a power of 2
//   lane_scale_min(h, e, s, m)          sub-block 2 tig + e's d sc (over decode_lane_int8's power of 2)
//                                       and dmin m (h: lane_head's; e a constant after unrolling), each
//                                       rounded once, as ggml's float32 products
//   static bool int8(p, phase)          (host) as kOptInt8's (phase 0 only, unless kInt8SumsDown)
//   kInt8Mins16 (optional, false)       16-value sub-blocks with mins (gguf Q2_K, in kOptLanes16's kernel):
//                                       decode_lane_int8's values are sc q (the sub-block scales in the
//                                       integers), lane_scale_min's s the block's d (over the power of
//                                       2) and m its dmin, and lane_mins_int8(h, m[2][2]) the A words of
//                                       sub-block t of unit 2 tig + e (its m in every byte) for a second
//                                       IMMA chain against the same x, whose 254 M_hi + M_lo takes X's place
//   kInt8SumsDown (optional, false)     phase 1 too (act from quantize_int8<false, 1>)
FTW_OPTIONAL_MEMBER(Int8Sums, kInt8Sums, bool, false);
FTW_OPTIONAL_MEMBER(Int8Mins16, kInt8Mins16, bool, false);
FTW_OPTIONAL_MEMBER(Int8SumsDown, kInt8SumsDown, bool, false);

// ---- byte streams with sub-block scales on float32 sums (gguf K-quants) ----------------------
//
// A decoder of byte-stream rows whose chunk is one block of sub-blocks of 32 values (Q4_K, Q5_K)
// or 16 (Q2_K, Q3_K, Q6_K: kSubBlockValues), each with its own scale and offset, may decode its
// quants as exact bf16 integers and leave the scales to float32: the four lanes of a quad split
// each sub-block (lane tig: values 8 tig .. 8 tig + 7 of a 32-value one, 4 tig .. 4 tig + 3 of a
// 16-value one), so that each mma's k16 lies in one sub-block (a 16-value sub-block is one k16
// step), and the sub-block's share of a row's dot product is s * P + n * X, P the mma's dot of the
// decoded integers with x, X the sum of x over the sub-block (an mma with a row of ones), s and n
// the sub-block's scale and offset in float32. A type without mins (kSubBlockMins false: Q3_K,
// Q6_K, whose offset is one integer for every sub-block) decodes its quants as the exact signed
// integers and has no X and no n: its share is s * P. Per pair of values the decode is then a
// prmt (and a mask or shift per 4; and a bf16 sub without mins), where the bf16 way
// (decode_staged) makes each value with a prmt, a bf16 sub and a bf16 fma; and no weight is
// rounded to bf16. Optional interface, on top of the byte-stream one (detected by kSubBlocks; the
// chunk holds exactly one block: kChunkBytes is the block, 256 values):
//   Head head(b)                        a row's block head, read from the ring at b
//   decode_pair(b, c2, tig, w[2][4])    the lane's 8 values of the chunk's 32-value units 2 c2 + e
//                                       into w[e] as bf16 pairs: values 8 tig .. 8 tig + 7
//                                       (32-value sub-blocks), or 4 tig .. 4 tig + 3 and
//                                       16 + 4 tig .. 16 + 4 tig + 3 (16-value ones: sub-blocks
//                                       2 (2 c2 + e) and the next); c2 a constant after unrolling
//   sub_scale(head, j, s, n)            sub-block j's s and n (j a constant after unrolling; n
//                                       unused without mins)
//   kSubBlockValues (optional, 32)      32 or 16
//   kSubBlockMins (optional, true)      whether n and X are needed
// H200, T=1, x the streaming ceiling, deepseek-v3 / qwen3-30b-a3b sizes (docs/BENCHMARKS.md, "K-quants
// on float32 sub-block sums"): Q4_K 0.43 / 0.27 -> 0.50 / 0.36, Q5_K 0.35 / 0.28 -> 0.53 / 0.34
// (with rings of 2 stages); 16-value sub-blocks ("16-value K-quant sub-blocks"): Q6_K 0.49 / 0.33
// -> 0.58 / 0.36, Q3_K 0.23 / 0.20 -> 0.35 / 0.30, Q2_K 0.25 / 0.22 -> 0.25 / 0.24; d once per chunk
// (kScaledInts, kUnitScales; "d once per chunk" there): Q2_K 0.25 / 0.24 -> 0.28 / 0.25, Q3_K
// 0.36 / 0.31 -> 0.38 / 0.31, Q6_K 0.57 / 0.37 unchanged; Q8_0 on block sums (kSplitValues,
// kSumOffset; "KQ2" there) 0.635 / 0.371 -> 0.646 / 0.391. Measured and dropped (Q4_K, 4 stages, against 0.47 / 0.30 the same
// way): the offsets summed by mma (a row of -128 into P, the integer mins into an accumulator
// scaled by dmin once per chunk: 0.46 / 0.30), the kernel compiled for 5 blocks per SM (96
// registers, 8-32 bytes of spills: 0.39 / 0.29).
//   kUnitScales (optional, false)       without mins: sub_scale's s in units of the row's d,
//                                       float head_d(head), applied once per chunk and row
//   kScaledInts (optional, false)       16-value sub-blocks: decode_scaled(b, head, c2, tig, w)
//                                       as decode_pair but each pair the exact integer scale *
//                                       quant, so the chunk's sub-blocks chain their mma and
//                                       float head_d(head) scales the sum once; with mins also
//                                       min_pair(head, j) (sub-block j's min, both halves) into a
//                                       second chain against x, times float head_dmin(head),
//                                       taken off (gguf Q3_K, Q2_K: decode_scaled); no sub_scale
//   kSplitValues (optional, false)      32-value sub-blocks of 8-bit quants: decode_pair fills
//                                       w[2][8], each value as two exact bf16 integers (pairs
//                                       w[e][0..3] and w[e][4..7], the same values in the same
//                                       order) whose sum is the quant plus a constant (gguf Q8_0:
//                                       128 + low nibble, 2048 + 16 high nibble); P sums both by
//                                       two more mma per sub-block (an int8 does not fit one bf16
//                                       magic), so the row may hold several blocks per chunk, each
//                                       a sub-block with its own scale (sub_scale)
//   kSumOffset (optional, 0)            with mins: n is -kSumOffset * s for every sub-block (one
//                                       constant offset: gguf Q8_0's 2304), so the share is
//                                       s * (P - kSumOffset * X): two fma, no n (sub_scale's unused)
FTW_HAS_MEMBER(SubBlocks, kSubBlocks);
FTW_OPTIONAL_MEMBER(SubBlockValues, kSubBlockValues, int, 32);
FTW_OPTIONAL_MEMBER(SubBlockMins, kSubBlockMins, bool, true);
FTW_OPTIONAL_MEMBER(UnitScales, kUnitScales, bool, false);
FTW_OPTIONAL_MEMBER(ScaledInts, kScaledInts, bool, false);
FTW_OPTIONAL_MEMBER(SplitValues, kSplitValues, bool, false);
FTW_OPTIONAL_MEMBER(SumOffset, kSumOffset, int, 0);
// the decoders on 32-value sub-block sums with mins (gguf Q4_K, Q5_K, Q8_0): kOptOneColumn, and
// down's parts in phases of few items (launch_staged_opt)
template <class Dec>
constexpr bool kSums32 = SubBlocks<Dec>::value && SubBlockValues<Dec>::value == 32 && SubBlockMins<Dec>::value &&
                         !ScaledInts<Dec>::value;
//   kWideLanes (optional, false)        with kScaledInts: the lanes take a 32-value unit as the
//                                       32-value sub-blocks do (lane tig: values 8 tig .. 8 tig + 7,
//                                       in sub-block tig / 2 of the two): a k16 step may span two
//                                       sub-blocks once their scales are in the mma. decode_scaled
//                                       then gives w[e] = the pairs of values 8 tig + 2i, + 1 (i = 0..3),
//                                       with mins min_pair_lane(head, c2, e, tig) the min of the lane's
//                                       sub-block of unit 2 c2 + e, and x is one 16-byte load per unit
//                                       (two 8-byte ones otherwise). H200, T=1, x the ceiling,
//                                       deepseek-v3 / qwen3-30b-a3b ("Wide lanes"): Q3_K 0.37 / 0.30
//                                       -> 0.39 / 0.32, Q2_K 0.27 / 0.25 -> 0.31 / 0.27
FTW_OPTIONAL_MEMBER(WideLanes, kWideLanes, bool, false);
// the first x value of the chunk a lane's pairs start at: 8 tig for 32-value sub-blocks and wide
// lanes, 4 tig for 16-value sub-blocks
template <class Dec>
constexpr int kSubBlockLaneValues = SubBlockValues<Dec>::value == 32 || WideLanes<Dec>::value ? 8 : 4;

// mma with a zero accumulator in, and with one in (not volatile: the compiler may schedule them)
__device__ __forceinline__ void mma_bf16_zero(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}
// kOptInt8's integer mma: A u8 (16 x 32, row), B s8 (32 x 8, col), int32 sums
__device__ __forceinline__ void imma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// kOptInt8's integer mma for signed units (kInt8Halves): A s8, B s8
__device__ __forceinline__ void imma_s8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16_acc(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A chunk's sums with the scales in the mma (kScaledInts; C[e]: sum sc q x per unit parity e, M[e]:
// with mins sum m x) into the accumulators of rows g (head h0) and g + 8 (h1): d and dmin once per chunk
template <class Dec, bool MINS, class Head>
__device__ __forceinline__ void add_chunk_sums(const Head& h0, const Head& h1, const float (&C)[2][4],
                                               const float (&M)[2][4], float (&acc)[4]) {
    const float d0 = Dec::head_d(h0), d1 = Dec::head_d(h1);
    if constexpr (MINS) {
        const float m0 = -Dec::head_dmin(h0), m1 = -Dec::head_dmin(h1);
        acc[0] = fmaf(d0, C[0][0] + C[1][0], fmaf(m0, M[0][0] + M[1][0], acc[0]));
        acc[1] = fmaf(d0, C[0][1] + C[1][1], fmaf(m0, M[0][1] + M[1][1], acc[1]));
        acc[2] = fmaf(d1, C[0][2] + C[1][2], fmaf(m1, M[0][2] + M[1][2], acc[2]));
        acc[3] = fmaf(d1, C[0][3] + C[1][3], fmaf(m1, M[0][3] + M[1][3], acc[3]));
    } else {
        acc[0] = fmaf(d0, C[0][0] + C[1][0], acc[0]), acc[1] = fmaf(d0, C[0][1] + C[1][1], acc[1]);
        acc[2] = fmaf(d1, C[0][2] + C[1][2], acc[2]), acc[3] = fmaf(d1, C[0][3] + C[1][3], acc[3]);
    }
}

// Dec's head and decode_scaled, with A4 the forms that read 4-byte-aligned blocks (kAligned4)
template <class Dec, bool A4>
__device__ __forceinline__ auto chunk_head(const uint8_t* b) {
    if constexpr (A4)
        return Dec::template head<true>(b);
    else
        return Dec::head(b);
}
template <class Dec, bool A4, class Head>
__device__ __forceinline__ void chunk_decode_scaled(const uint8_t* b, const Head& h, int c2, int tig, uint32_t (&w)[2][4]) {
    if constexpr (A4)
        Dec::template decode_scaled<true>(b, h, c2, tig, w);
    else
        Dec::decode_scaled(b, h, c2, tig, w);
}

// One chunk of rows g (block at b0) and g + 8 (b1) against x's values xc[0..255] (this lane's
// pair's x from its first value on: kSubBlockLaneValues tig; any pair's where the lane has none),
// into the lane's accumulators.
// ONE: an item of one pair (T = 1), whose only live sums are pair column 0's (lane tig 0's
// accumulators 0 and 2): no lane updates accumulators 1 and 3 (kOptOneColumn).
// A4: both blocks start on a 4-byte boundary (decoders with kAligned4: their head and decode_scaled
// with A4 read them so).
FTW_OPTIONAL_MEMBER(Aligned4, kAligned4, bool, false);
template <class Dec, bool ONE = false, bool A4 = false>
__device__ __forceinline__ void staged_sub_block_chunk(const uint8_t* b0, const uint8_t* b1, const __nv_bfloat16* xc,
                                                       int tig, float (&acc)[4]) {
    constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 pair (1, 1)
    constexpr int SV = SubBlockValues<Dec>::value;
    constexpr bool MINS = SubBlockMins<Dec>::value;
    constexpr int NS = 32 / SV, KS = SV / 16;  // sub-blocks per 32-value unit, k16 steps per sub-block
    static_assert(SV == 32 || SV == 16, "sub-blocks of 32 or 16 values");
    constexpr bool UNITS = UnitScales<Dec>::value;
    static_assert(!UNITS || !MINS, "scales in units of d: no mins");
    static_assert(!A4 || (Aligned4<Dec>::value && WideLanes<Dec>::value), "the aligned body: wide lanes");
    static_assert(!A4 || !MINS, "the aligned body: no mins (Q3_K)");
    const auto h0 = chunk_head<Dec, A4>(b0);
    const auto h1 = chunk_head<Dec, A4>(b1);
    if constexpr (WideLanes<Dec>::value) {  // the scales in the mma, a lane's 8 values of a unit adjacent
        static_assert(ScaledInts<Dec>::value && SV == 16, "wide lanes: 16-value sub-blocks, scales in the mma");
        float C[2][4], M[2][4];  // sum sc q x; with mins sum m x
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2) {
            uint32_t wa[2][4], wb[2][4];
            chunk_decode_scaled<Dec, A4>(b0, h0, c2, tig, wa);
            chunk_decode_scaled<Dec, A4>(b1, h1, c2, tig, wb);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint4 xs = __ldg(reinterpret_cast<const uint4*>(xc + 32 * (2 * c2 + e)));
                if (c2 == 0)
                    mma_bf16_zero(C[e], wa[e][0], wb[e][0], wa[e][1], wb[e][1], xs.x, xs.y);
                else
                    mma_bf16_acc(C[e], wa[e][0], wb[e][0], wa[e][1], wb[e][1], xs.x, xs.y);
                mma_bf16_acc(C[e], wa[e][2], wb[e][2], wa[e][3], wb[e][3], xs.z, xs.w);
                if constexpr (MINS) {  // the lane's sub-block of the unit: one min pair for its 8 values
                    const uint32_t ma = Dec::min_pair_lane(h0, c2, e, tig), mb = Dec::min_pair_lane(h1, c2, e, tig);
                    if (c2 == 0)
                        mma_bf16_zero(M[e], ma, mb, ma, mb, xs.x, xs.y);
                    else
                        mma_bf16_acc(M[e], ma, mb, ma, mb, xs.x, xs.y);
                    mma_bf16_acc(M[e], ma, mb, ma, mb, xs.z, xs.w);
                }
            }
        }
        add_chunk_sums<Dec, MINS>(h0, h1, C, M, acc);
        return;
    }
    if constexpr (ScaledInts<Dec>::value) {  // the scales in the mma: chains per unit parity e
        static_assert(SV == 16, "16-value sub-blocks");
        float C[2][4], M[2][4];  // sum sc q x; with mins sum m x
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2) {
            uint32_t wa[2][4], wb[2][4];
            Dec::decode_scaled(b0, h0, c2, tig, wa);
            Dec::decode_scaled(b1, h1, c2, tig, wb);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint2 xs[2] = {__ldg(reinterpret_cast<const uint2*>(xc + 32 * (2 * c2 + e))),
                                     __ldg(reinterpret_cast<const uint2*>(xc + 32 * (2 * c2 + e) + 16))};
#pragma unroll
                for (int t = 0; t < 2; ++t) {  // sub-block j = 2 (2 c2 + e) + t
                    if (c2 == 0 && t == 0)
                        mma_bf16_zero(C[e], wa[e][0], wb[e][0], wa[e][1], wb[e][1], xs[0].x, xs[0].y);
                    else
                        mma_bf16_acc(C[e], wa[e][2 * t], wb[e][2 * t], wa[e][2 * t + 1], wb[e][2 * t + 1], xs[t].x, xs[t].y);
                    if constexpr (MINS) {
                        const int j = 2 * (2 * c2 + e) + t;
                        const uint32_t ma = Dec::min_pair(h0, j), mb = Dec::min_pair(h1, j);
                        if (c2 == 0 && t == 0)
                            mma_bf16_zero(M[e], ma, mb, ma, mb, xs[0].x, xs[0].y);
                        else
                            mma_bf16_acc(M[e], ma, mb, ma, mb, xs[t].x, xs[t].y);
                    }
                }
            }
        }
        add_chunk_sums<Dec, MINS>(h0, h1, C, M, acc);
        return;
    }
    float cs[4] = {0.f, 0.f, 0.f, 0.f};  // with UNITS: the chunk's sums in units of each row's d
    float(&a)[4] = UNITS ? cs : acc;
#pragma unroll
    for (int c2 = 0; c2 < 4; ++c2) {
        uint4 xv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if constexpr (SV == 32) {
                xv[e] = __ldg(reinterpret_cast<const uint4*>(xc + 32 * (2 * c2 + e)));
            } else {  // values 4 tig .. 4 tig + 3 of the unit's two sub-blocks
                const uint2 lo = __ldg(reinterpret_cast<const uint2*>(xc + 32 * (2 * c2 + e)));
                const uint2 hi = __ldg(reinterpret_cast<const uint2*>(xc + 32 * (2 * c2 + e) + 16));
                xv[e] = make_uint4(lo.x, lo.y, hi.x, hi.y);
            }
        }
        constexpr int NW = SplitValues<Dec>::value ? 8 : 4;  // pairs per unit and row
        static_assert(NW == 4 || SV == 32, "split values: 32-value sub-blocks");
        uint32_t wa[2][NW], wb[2][NW];
        Dec::decode_pair(b0, c2, tig, wa);
        Dec::decode_pair(b1, c2, tig, wb);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t xe[4] = {xv[e].x, xv[e].y, xv[e].z, xv[e].w};
#pragma unroll
            for (int t = 0; t < NS; ++t) {  // the unit's sub-blocks, of KS k16 steps each (k = 2 t + i)
                float P[4], X[4];
#pragma unroll
                for (int i = 0; i < KS; ++i) {
                    const int k = 2 * (KS * t + i);
                    if (i == 0)
                        mma_bf16_zero(P, wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], xe[k], xe[k + 1]);
                    else
                        mma_bf16_acc(P, wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], xe[k], xe[k + 1]);
                }
#pragma unroll
                for (int i = 0; i < KS && NW == 8; ++i) {  // split values: their second parts, same x
                    const int k = 2 * (KS * t + i), h = (k + 4) % NW;  // (h: k + 4, in range where NW = 4)
                    mma_bf16_acc(P, wa[e][h], wb[e][h], wa[e][h + 1], wb[e][h + 1], xe[k], xe[k + 1]);
                }
#pragma unroll
                for (int i = 0; i < KS && MINS; ++i) {  // every row: the sum of x
                    const int k = 2 * (KS * t + i);
                    if (i == 0)
                        mma_bf16_zero(X, kOnes, kOnes, kOnes, kOnes, xe[k], xe[k + 1]);
                    else
                        mma_bf16_acc(X, kOnes, kOnes, kOnes, kOnes, xe[k], xe[k + 1]);
                }
                const int j = NS * (2 * c2 + e) + t;
                float s0, n0, s1, n1;
                Dec::sub_scale(h0, j, s0, n0);
                Dec::sub_scale(h1, j, s1, n1);
                // accumulator i: row g + 8 (i / 2), pair column 2 tig + (i & 1); X[i] the column's sum
#pragma unroll
                for (int i = 0; i < 4; i += ONE ? 2 : 1) {
                    const float s = i < 2 ? s0 : s1, n = i < 2 ? n0 : n1;
                    if constexpr (!MINS)
                        a[i] = fmaf(s, P[i], a[i]);
                    else if constexpr (SumOffset<Dec>::value != 0)
                        acc[i] = fmaf(s, fmaf(-float(SumOffset<Dec>::value), X[i], P[i]), acc[i]);
                    else
                        acc[i] = fmaf(s, P[i], fmaf(n, X[i], acc[i]));
                }
            }
        }
    }
    if constexpr (UNITS) {
        const float d0 = Dec::head_d(h0), d1 = Dec::head_d(h1);
        acc[0] = fmaf(d0, cs[0], acc[0]), acc[1] = fmaf(d0, cs[1], acc[1]);
        acc[2] = fmaf(d1, cs[2], acc[2]), acc[3] = fmaf(d1, cs[3], acc[3]);
    }
}

// kOptLaneBlocks' chunk body (an item of one pair, T = 1): lane (g, tig) decodes sub-blocks 2 tig + e
// (e = 0, 1) of rows g (block at b0) and g + 8 (b1), 8 values per step pair p (decode_lane: w[e][0..3]
// the pairs of values 8 p .. 8 p + 7), and in each mma its A values are its own sub-block's; the B
// lane (2 tig, tig) gives x of lane tig's sub-blocks (xl: the chunk's values 64 tig .. 64 tig + 63),
// every other lane zeros (xl: lane_zeros), so column 2 tig of P (and of X, the sum of x: an mma with
// a row of ones) holds sub-block 2 tig + e's sums of rows g (P[e][0]) and g + 8 (P[e][2]) alone.
// Each lane then applies its own sub-blocks' s and n (lane_scale: as sub_scale, the same float32
// arithmetic) into acc[0] and acc[2], per chunk 4 (row, sub-block) terms where the one-column body
// takes 16 in every lane; the quad's lanes are summed once per item (the kernel's shuffles).
// Interface (optional, on top of the sub-block one; kLaneBlocks):
//   LaneHead lane_head(b, tig)           what lane_scale needs of a row's head for sub-blocks
//                                        2 tig, 2 tig + 1
//   lane_scale(h, e, s, n)               sub-block 2 tig + e's s and n (e a constant after unrolling)
//   decode_lane(b, tig, p, w[2][4])      the lane's values 8 p .. 8 p + 7 of sub-blocks 2 tig + e;
//                                        with kSplitValues w[2][8], as decode_pair's (gguf Q8_0,
//                                        each 32-value block a sub-block: kSumOffset as there)
FTW_OPTIONAL_MEMBER(LaneBlocks, kLaneBlocks, bool, false);
FTW_OPTIONAL_MEMBER(LaneBlocksDefault, kLaneBlocksDefault, bool, true);  // (staged_lane_blocks)
// 128 bf16 zeros: the x of the lanes that supply none (kOptLaneBlocks reads 64, kOptLanes16 80)
static __device__ __align__(16) const uint4 kLaneZeros[16] = {};
__device__ __forceinline__ const __nv_bfloat16* lane_zeros() { return reinterpret_cast<const __nv_bfloat16*>(kLaneZeros); }
// Sub-block 2 tig + e's sums of rows g (p0) and g + 8 (p2) into acc, with its scale and min (or
// the decoder's kSumOffset) against x's sum over the sub-block (xs: the same for both rows)
template <class Dec, class Head>
__device__ __forceinline__ void add_lane_sums(const Head& h0, const Head& h1, int e, float p0, float p2, float xs,
                                              float (&acc)[4]) {
    float s0, n0, s1, n1;
    Dec::lane_scale(h0, e, s0, n0);
    Dec::lane_scale(h1, e, s1, n1);
    if constexpr (SumOffset<Dec>::value != 0) {  // as staged_sub_block_chunk's
        acc[0] = fmaf(s0, fmaf(-float(SumOffset<Dec>::value), xs, p0), acc[0]);
        acc[2] = fmaf(s1, fmaf(-float(SumOffset<Dec>::value), xs, p2), acc[2]);
    } else {
        acc[0] = fmaf(s0, p0, fmaf(n0, xs, acc[0]));
        acc[2] = fmaf(s1, p2, fmaf(n1, xs, acc[2]));
    }
}
template <class Dec>
__device__ __forceinline__ void staged_sub_block_lanes(const uint8_t* b0, const uint8_t* b1, const __nv_bfloat16* xl,
                                                       int tig, float (&acc)[4]) {
    constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 pair (1, 1)
    static_assert(SubBlockValues<Dec>::value == 32 && SubBlockMins<Dec>::value, "32-value sub-blocks with mins");
    constexpr int NW = SplitValues<Dec>::value ? 8 : 4;  // pairs per step pair and row (split values: two sets)
    const auto h0 = Dec::lane_head(b0, tig);
    const auto h1 = Dec::lane_head(b1, tig);
    float P[2][4], X[2][4];  // [e]: sub-block 2 tig + e in column 2 tig
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        uint32_t wa[2][NW], wb[2][NW];
        Dec::decode_lane(b0, tig, p, wa);
        Dec::decode_lane(b1, tig, p, wb);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint4 xs = __ldg(reinterpret_cast<const uint4*>(xl + 32 * e + 8 * p));
#pragma unroll
            for (int k = 0; k < 4; k += 2) {  // steps 2 p (x pairs xs.x, xs.y) and 2 p + 1 (xs.z, xs.w)
                const uint32_t x0 = k ? xs.z : xs.x, x1 = k ? xs.w : xs.y;
                if (p == 0 && k == 0) {
                    mma_bf16_zero(P[e], wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], x0, x1);
                    mma_bf16_zero(X[e], kOnes, kOnes, kOnes, kOnes, x0, x1);
                } else {
                    mma_bf16_acc(P[e], wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], x0, x1);
                    mma_bf16_acc(X[e], kOnes, kOnes, kOnes, kOnes, x0, x1);
                }
                if constexpr (NW == 8)  // split values: their second parts, same x
                    mma_bf16_acc(P[e], wa[e][k + 4], wb[e][k + 4], wa[e][k + 5], wb[e][k + 5], x0, x1);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) add_lane_sums<Dec>(h0, h1, e, P[e][0], P[e][2], X[e][0], acc);
}

// kOptLaneCols: as staged_sub_block_lanes, but the B lanes (2 tig + e, tig) give x of lane tig's
// sub-block 2 tig + e (xl: the chunk's values 64 tig + 32 e ..), so column 2 tig + e holds x of
// sub-block 2 tig + e alone: one mma per step sums the ones against both columns (X: 8 mma a chunk
// instead of 16), P[e]'s column 2 tig + e is sub-block 2 tig + e's sum (its other column, the other
// sub-block's x against it, is dropped), and a lane loads one 16-byte x per step pair, not two.
template <class Dec>
__device__ __forceinline__ void staged_sub_block_lane_cols(const uint8_t* b0, const uint8_t* b1,
                                                           const __nv_bfloat16* xl, int tig, float (&acc)[4]) {
    constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 pair (1, 1)
    static_assert(SubBlockValues<Dec>::value == 32 && SubBlockMins<Dec>::value, "32-value sub-blocks with mins");
    constexpr int NW = SplitValues<Dec>::value ? 8 : 4;
    const auto h0 = Dec::lane_head(b0, tig);
    const auto h1 = Dec::lane_head(b1, tig);
    float P[2][4], X[4];  // P[e]: sub-block 2 tig + e in column 2 tig + e; X: both columns
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        uint32_t wa[2][NW], wb[2][NW];
        Dec::decode_lane(b0, tig, p, wa);
        Dec::decode_lane(b1, tig, p, wb);
        const uint4 xs = __ldg(reinterpret_cast<const uint4*>(xl + 8 * p));
#pragma unroll
        for (int k = 0; k < 4; k += 2) {  // steps 2 p (x pairs xs.x, xs.y) and 2 p + 1 (xs.z, xs.w)
            const uint32_t x0 = k ? xs.z : xs.x, x1 = k ? xs.w : xs.y;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (p == 0 && k == 0)
                    mma_bf16_zero(P[e], wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], x0, x1);
                else
                    mma_bf16_acc(P[e], wa[e][k], wb[e][k], wa[e][k + 1], wb[e][k + 1], x0, x1);
                if constexpr (NW == 8)  // split values: their second parts, same x
                    mma_bf16_acc(P[e], wa[e][k + 4], wb[e][k + 4], wa[e][k + 5], wb[e][k + 5], x0, x1);
            }
            if (p == 0 && k == 0)
                mma_bf16_zero(X, kOnes, kOnes, kOnes, kOnes, x0, x1);
            else
                mma_bf16_acc(X, kOnes, kOnes, kOnes, kOnes, x0, x1);
        }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) add_lane_sums<Dec>(h0, h1, e, P[e][e], P[e][2 + e], X[e], acc);
}

// kOptInt8Sums' chunk body (phase 0, an item of one pair, T = 1): lane (g, tig) decodes its
// sub-blocks 2 tig + e of rows g (block at b0) and g + 8 (b1) as u8 q (decode_lane_int8) into the
// A fragment, and the B lanes (2 tig + h, tig) give plane h (hi, lo) of x's group 2 tig + e of the
// chunk (xq8: the chunk's first group, plane h; null in every other lane, which keeps zeros), so
// S[e]'s columns 2 tig and 2 tig + 1 are sub-block 2 tig + e's sums against hi and lo, and
// I = 254 S_hi + S_lo = sum q (254 hi + lo) exactly, in int32 (|I| < 2^28: Q4_K's 16 q), with
// x = (s / 254) (254 hi + lo). With xm the lane's two groups' {s / 254, bits of X = 254 sum(hi) +
// sum(lo)} (quantize_int8), the sub-block's share of a row's dot is (s / 254) (d sc I - dmin m X):
// an IMAD, an I2F, an FMUL and two FFMA per row and sub-block. The quad's lanes are summed once per
// item (kOptLaneBlocks' shuffles). With kInt8Mins16 (Q2_K: lane tig's 32-value units 2 tig + e, each
// two 16-value sub-blocks with their scales in the integers) the mins' IMMA chain gives per row and
// unit M = sum m (254 hi + lo), and the share is (s / 254) (d I' - dmin M), I' = sum sc q (254 hi + lo).
template <class Dec>
__device__ __forceinline__ void staged_sub_block_int8(const uint8_t* b0, const uint8_t* b1, const uint4* xq8,
                                                      const float4* xm, int tig, float (&acc)[4]) {
    constexpr bool M16 = Int8Mins16<Dec>::value;
    static_assert(M16 ? SubBlockValues<Dec>::value == 16 && SubBlockMins<Dec>::value
                      : SubBlockValues<Dec>::value == 32 && SubBlockMins<Dec>::value,
                  "32-value sub-blocks with mins, or 16-value ones with their mins by IMMA");
    const auto h0 = Dec::lane_head(b0, tig);
    const auto h1 = Dec::lane_head(b1, tig);
    uint4 xb[2][2] = {};  // [e][s / 2]: the B words b0, b1 of step s (values 8 s .. 8 s + 7), two a load
    if (xq8 != nullptr) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int k = 0; k < 2; ++k) xb[e][k] = __ldg(xq8 + 4 * (2 * tig + e) + k);
    }
    const float4 xs = __ldg(xm + tig);  // groups 2 tig, 2 tig + 1: {s / 254, X} each
    uint32_t a0[2][8], a1[2][8];
    Dec::decode_lane_int8(b0, tig, a0);
    Dec::decode_lane_int8(b1, tig, a1);
    int S[2][4] = {}, M[2][4] = {};  // M: kInt8Mins16's sums of the mins
    uint32_t n0[2][2] = {}, n1[2][2] = {};  // [e][t]: the mins' A words of rows g, g + 8 (sub-block t)
    if constexpr (M16) Dec::lane_mins_int8(h0, n0), Dec::lane_mins_int8(h1, n1);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint4& xq = xb[e][s >> 1];
            const uint32_t x0 = s & 1 ? xq.z : xq.x, x1 = s & 1 ? xq.w : xq.y;
            imma_u8s8(S[e], a0[e][2 * s], a1[e][2 * s], a0[e][2 * s + 1], a1[e][2 * s + 1], x0, x1);
            if constexpr (M16)  // (step s: values 8 s .. 8 s + 7, in sub-block s / 2)
                imma_u8s8(M[e], n0[e][s >> 1], n1[e][s >> 1], n0[e][s >> 1], n1[e][s >> 1], x0, x1);
        }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        float s0, m0, s1, m1;
        Dec::lane_scale_min(h0, e, s0, m0);
        Dec::lane_scale_min(h1, e, s1, m1);
        const float f = e ? xs.z : xs.x, X = float(__float_as_int(e ? xs.w : xs.y));
        const float X0 = M16 ? float(254 * M[e][0] + M[e][1]) : X, X2 = M16 ? float(254 * M[e][2] + M[e][3]) : X;
        const float i0 = float(254 * S[e][0] + S[e][1]), i2 = float(254 * S[e][2] + S[e][3]);
        acc[0] = fmaf(f, fmaf(s0, i0, -m0 * X0), acc[0]);
        acc[2] = fmaf(f, fmaf(s1, i2, -m1 * X2), acc[2]);
    }
}

// kOptLanes16's chunk body (an item of one pair, T = 1), for 16-value sub-blocks whose quants are
// biased (kLaneBias16 + the stored bits, scaled by a power of 2: the prmt's pairs, no bf16 op): lane
// (g, tig) decodes its sub-blocks s = 0..3 (the chunk's values 128 (tig / 2) + 32 s + 16 (tig % 2)
// .. + 15: the 4 units of a 128-value half share their byte planes' bytes, so a lane reads 16
// contiguous bytes of each plane) of rows g (block at b0) and g + 8 (b1), 4 values per step i
// (decode_lane16: w[s][0..1] the pairs of values 4 i .. 4 i + 3). As kOptLaneCols, the B lanes
// (2 tig + e, tig) give x of lane tig's sub-blocks e and e + 2 (xl: the chunk's values from
// 128 (tig / 2) + 16 (tig % 2) + 32 e on; sub-block e + 2 is 64 values on), every other lane zeros,
// so P[s]'s column 2 tig + s % 2 sums sub-block s alone, and X[q] (an mma against a row of ones per
// step) x's sums of sub-blocks 2 q, 2 q + 1 in those columns. Each lane then takes the bias off
// (P - kLaneBias16 X: exact integers in the mma, one rounding in float32), applies its 4 scales per
// row (with mins, its 4 mins against X) and d (dmin) once per chunk (as kUnitScales): 8 scales per
// chunk where Q6_K's full body takes 32 in every lane. Interface (optional, on top of the sub-block
// one; kLanes16):
//   LaneHead16 lane_head16(b, tig)       what lane_scale16 needs of a row's head: d, lane tig's scales
//   float lane_scale16(h, s)             sub-block s's scale in units of d over decode_lane16's power
//                                        of 2 (s a constant after unrolling)
//   float lane_d16(h)                    d
//   float lane_min16(h, s), lane_dmin16  with mins (kSubBlockMins): sub-block s's min in units of dmin;
//                                        dmin
//   decode_lane16(b, tig, i, w[4][2])    step i: the biased pairs of values 4 i .. 4 i + 3 of
//                                        sub-blocks s = 0..3 of lane tig
//   kLaneBias16                          the bias of decode_lane16's pairs
FTW_OPTIONAL_MEMBER(Lanes16, kLanes16, bool, false);
FTW_OPTIONAL_MEMBER(LaneBias16, kLaneBias16, int, 0);
FTW_OPTIONAL_MEMBER(Lanes16Default, kLanes16Default, bool, true);  // (staged_lanes16)
template <class Dec>
__device__ __forceinline__ void staged_sub_block_lanes16(const uint8_t* b0, const uint8_t* b1, const __nv_bfloat16* xl,
                                                         int tig, float (&acc)[4]) {
    constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 pair (1, 1)
    constexpr bool MINS = SubBlockMins<Dec>::value;
    static_assert(SubBlockValues<Dec>::value == 16, "16-value sub-blocks");
    const auto h0 = Dec::lane_head16(b0, tig);
    const auto h1 = Dec::lane_head16(b1, tig);
    float P[4][4], X[2][4];  // P[s]: sub-block s in column 2 tig + s % 2; X[q]: sub-blocks 2 q, 2 q + 1
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const uint4 xs[2] = {__ldg(reinterpret_cast<const uint4*>(xl + 8 * p)),
                             __ldg(reinterpret_cast<const uint4*>(xl + 64 + 8 * p))};
#pragma unroll
        for (int k = 0; k < 2; ++k) {  // step i = 2 p + k: x pairs xs[q].x, .y (k = 0) or .z, .w
            uint32_t wa[4][2], wb[4][2];
            Dec::decode_lane16(b0, tig, 2 * p + k, wa);
            Dec::decode_lane16(b1, tig, 2 * p + k, wb);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const uint32_t x0 = k ? xs[q].z : xs[q].x, x1 = k ? xs[q].w : xs[q].y;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int s = 2 * q + e;
                    if (p == 0 && k == 0)
                        mma_bf16_zero(P[s], wa[s][0], wb[s][0], wa[s][1], wb[s][1], x0, x1);
                    else
                        mma_bf16_acc(P[s], wa[s][0], wb[s][0], wa[s][1], wb[s][1], x0, x1);
                }
                if (p == 0 && k == 0)
                    mma_bf16_zero(X[q], kOnes, kOnes, kOnes, kOnes, x0, x1);
                else
                    mma_bf16_acc(X[q], kOnes, kOnes, kOnes, kOnes, x0, x1);
            }
        }
    }
    float c0 = 0.f, c2 = 0.f, n0 = 0.f, n2 = 0.f;  // rows g and g + 8 in units of d (with mins: of dmin)
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int e = s & 1;
        const float xs = X[s >> 1][e], xb = -float(Dec::kLaneBias16) * xs;
        c0 = fmaf(Dec::lane_scale16(h0, s), P[s][e] + xb, c0);
        c2 = fmaf(Dec::lane_scale16(h1, s), P[s][2 + e] + xb, c2);
        if constexpr (MINS) n0 = fmaf(Dec::lane_min16(h0, s), xs, n0), n2 = fmaf(Dec::lane_min16(h1, s), xs, n2);
    }
    acc[0] = fmaf(Dec::lane_d16(h0), c0, acc[0]);
    acc[2] = fmaf(Dec::lane_d16(h1), c2, acc[2]);
    if constexpr (MINS) acc[0] = fmaf(-Dec::lane_dmin16(h0), n0, acc[0]), acc[2] = fmaf(-Dec::lane_dmin16(h1), n2, acc[2]);
}

// ---- byte streams as signed integers with scales on float32 sums (gguf IQ types) ------------
//
// As the sub-block sums above, for rows whose values are a scale times a signed small integer
// with no offset (the IQ grids, looked up as exact bf16): per scale group the mma's dot P of the
// integers with x, times the group's float32 scale, into the accumulators; no sum of x and no
// weight rounded. Optional interface, on top of the byte-stream one (detected by kIntSums; the
// chunk holds exactly one block of 8 sub-blocks of 32 values):
//   kScaleGroup                          values per scale: 32 (lane tig: values 8 tig .. 8 tig + 7
//                                        of each sub-block, two mma chained) or 16 (values
//                                        4 tig .. 4 tig + 3 of each half, an mma per half)
//   float head(b)                        a row's block scale d, read from the ring at b
//   int_values(b, j, tig, w[4], s[2])    the lane's values of sub-block j as bf16 pairs in the
//                                        order above, and its groups' scales in units of d (the
//                                        chunk's sums are multiplied by d once)
// gguf's IqInt<T> (csrc/formats/gguf/decoders.cuh) has the figures (H200, T=1, x the ceiling:
// IQ3_S 0.22 -> 0.28 at the deepseek-v3 size; docs/BENCHMARKS.md, "IQ types on float32 sub-block sums").
FTW_HAS_MEMBER(IntSums, kIntSums);

// One chunk of rows g (block at b0) and g + 8 (b1) against x's values xc[0..255] (this lane's
// pair's chunk, any pair's where the lane has none), into the lane's accumulators.
template <class Dec>
__device__ __forceinline__ void staged_int_sum_chunk(const uint8_t* b0, const uint8_t* b1, const __nv_bfloat16* xc,
                                                     int tig, float (&acc)[4]) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};  // the chunk's sums in units of each row's d
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        uint32_t wa[4], wb[4];
        float sa[2], sb[2];
        Dec::int_values(b0, j, tig, wa, sa);
        Dec::int_values(b1, j, tig, wb, sb);
        // accumulator i: row g + 8 (i / 2), pair column 2 tig + (i & 1)
        if constexpr (Dec::kScaleGroup == 32) {
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xc + 32 * j + 8 * tig));
            float P[4];
            mma_bf16_zero(P, wa[0], wb[0], wa[1], wb[1], xv.x, xv.y);
            mma_bf16_acc(P, wa[2], wb[2], wa[3], wb[3], xv.z, xv.w);
            c[0] = fmaf(sa[0], P[0], c[0]), c[1] = fmaf(sa[0], P[1], c[1]);
            c[2] = fmaf(sb[0], P[2], c[2]), c[3] = fmaf(sb[0], P[3], c[3]);
        } else {
            static_assert(Dec::kScaleGroup == 16, "scale groups of 32 or 16 values");
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xc + 32 * j + 16 * e + 4 * tig));
                float P[4];
                mma_bf16_zero(P, wa[2 * e], wb[2 * e], wa[2 * e + 1], wb[2 * e + 1], xv.x, xv.y);
                c[0] = fmaf(sa[e], P[0], c[0]), c[1] = fmaf(sa[e], P[1], c[1]);
                c[2] = fmaf(sb[e], P[2], c[2]), c[3] = fmaf(sb[e], P[3], c[3]);
            }
        }
    }
    const float d0 = Dec::head(b0), d1 = Dec::head(b1);
    acc[0] = fmaf(d0, c[0], acc[0]), acc[1] = fmaf(d0, c[1], acc[1]);
    acc[2] = fmaf(d1, c[2], acc[2]), acc[3] = fmaf(d1, c[3], acc[3]);
}

template <class Dec, int OPT, class Raw, class W>
__device__ __forceinline__ void staged_decode_unit(const Raw& raw, W& w) {
    if constexpr (!(OPT & kOptDecode) && HasDecodeV0<Dec>::value)
        Dec::decode_v0(raw, w);
    else if constexpr (!(OPT & kOptScale2) && HasDecodeV1<Dec>::value)
        Dec::decode_v1(raw, w);
    else
        Dec::decode(raw, w);
}

// 16 bytes through the read-only path where `p` holds, else v as it was: a predicated load (no
// branch, no select), for lanes that keep part of a register set at zero
__device__ __forceinline__ void ldg_if(bool p, const uint4* a, uint4& v) {
    asm("{\n .reg .pred q;\n setp.ne.b32 q, %4, 0;\n @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%5];\n}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "r"(int(p)), "l"(a));
}

// The int8 quantizers' start (quantize_int8, quantize_int8_tokens): PH 0 waits for the kernel before
// it (a programmatic launch: FTW_CUDA_PDL0=1, the previous step) and lets phase 0 start; PH 1 lets
// phase 1 start at once and waits for phase 0 (act written).
template <int PH>
__device__ __forceinline__ void quantize_int8_start() {
    if (PH == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (PH == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
}
// t = x / s (|t| <= 127) as hi = rint(t) and lo = rint((t - hi) * 254), so x = s (hi + lo / 254)
// within s / 508
__device__ __forceinline__ void int8_hi_lo(float t, int& hi, int& lo) {
    const float th = rintf(t);
    hi = int(th), lo = __float2int_rn((t - th) * 254.f);
}

// kOptInt8: token 0's x (T = 1) in integers for phase 0 (PH 0: p.x into p.xq), or act for phase 1
// (PH 1: the K pairs' rows of act into p.actq), a warp per 32-value group j: s_j = max|x| / 127,
// hi = rint(x / s_j), lo = rint((x / s_j - hi) * 254) (both in -127..127), so x = s_j (hi + lo / 254)
// within s_j / 508, about 1.5e-5 of the group's largest |x| (bf16's rounding of x is 2^-9 of it).
// Stored per group: 32 bytes of hi, then 32 of lo, each value at the byte the decoder's A fragment
// wants it (Interleaved: kInt8Interleaved's order), then after all groups a float2 {s_j / 254, int
// bits of 254 sum(hi) + sum(lo)} per group (the decoders' u8 bias comes off through it). Launched just
// before the phase in its stream (launch_byte_stream); the phase is its programmatic dependent, which
// lets the phase's blocks route and put their first weights in flight while this runs. PH 0 waits for
// the kernel before it (FTW_CUDA_PDL0=1: the previous step) before phase 0 may start (phase 0 clears
// out before it waits); PH 1 lets phase 1 start at once and waits for phase 0 (act). A non-finite x
// gives no finite output.
template <bool Interleaved, int PH>
__global__ void __launch_bounds__(128) quantize_int8(const KernelParams p) {
    quantize_int8_start<PH>();
    const int ngroups = PH == 0 ? p.H / 32 : p.K * (p.I / 32);
    const int gi = int(blockIdx.x) * 4 + int(threadIdx.x >> 5), v = threadIdx.x & 31;
    if (gi >= ngroups) return;
    const float x = __bfloat162float((PH == 0 ? p.x : p.act)[int64_t(gi) * 32 + v]);
    const float m = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(x))));
    const float t = m > 0.f ? x * (127.f / m) : 0.f;
    int hi, lo;
    int8_hi_lo(t, hi, lo);
    const int sum = 254 * __reduce_add_sync(0xffffffffu, hi) + __reduce_add_sync(0xffffffffu, lo);
    // Interleaved: value v = 16 n + 4 s + r (n: the nibble, s: the word, r: the byte in it) at byte
    // 16 (r / 2) + 4 s + 2 (r % 2) + n
    const int pos = Interleaved ? 16 * ((v >> 1) & 1) + 4 * ((v >> 2) & 3) + 2 * (v & 1) + (v >> 4) : v;
    uint8_t* const xq = PH == 0 ? p.xq : p.actq;
    uint8_t* q = xq + int64_t(gi) * 64;
    q[pos] = uint8_t(int8_t(hi));
    q[32 + pos] = uint8_t(int8_t(lo));
    if (v == 0) reinterpret_cast<float2*>(xq + int64_t(ngroups) * 64)[gi] = make_float2(m / 127.f / 254.f, __int_as_float(sum));
}

// kOptInt8Tokens: every token's x (PH 0: p.T rows of p.x into p.xq) or every pair's act (PH 1: the
// T K rows of p.act into p.actq) in integers, a warp per row and chunk of 256 values: s = max|x| /
// 127 over the chunk, hi and lo as quantize_int8's (x = s (hi + lo / 254)). Lane l takes unit
// u = l / 4 of the chunk, values 4 (l % 4) + i and 16 + 4 (l % 4) + i (i = 0..3), and stores each at
// the slot Dec::int8_tokens_slot gives: unit u's 64 bytes are lane tig's B words at 16 tig (hi of
// k 4 tig .., hi of k 16 + 4 tig .., then the two lo words), one 16-byte load for the body. After
// all rows' units, a float s / 254 per row and chunk. Launched as quantize_int8 is (a programmatic
// dependent of the kernel before; the phase its programmatic dependent); a non-finite x gives no
// finite output. Units past the row's end are not stored (the body takes whole chunks only).
template <class Dec, int PH>
__global__ void __launch_bounds__(128) quantize_int8_tokens(const KernelParams p) {
    quantize_int8_start<PH>();
    const int in = PH == 0 ? p.H : p.I;
    const int nunits = in / 32, nch = (nunits + 7) / 8, rows = PH == 0 ? p.T : p.T * p.K;
    const int wi = int(blockIdx.x) * 4 + int(threadIdx.x >> 5), l = threadIdx.x & 31;
    if (wi >= rows * nch) return;
    const int r = wi / nch, c = wi - r * nch;
    const int u = c * 8 + (l >> 2), v0 = 4 * (l & 3);
    const bool ok = u < nunits;
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // values v0 + i, then 16 + v0 + i
    if (ok) {
        const __nv_bfloat16* src = (PH == 0 ? p.x : p.act) + int64_t(r) * in + int64_t(u) * 32 + v0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint2 w = *reinterpret_cast<const uint2*>(src + 16 * h);
            x[4 * h] = __uint_as_float(w.x << 16), x[4 * h + 1] = __uint_as_float(w.x & 0xFFFF0000u);
            x[4 * h + 2] = __uint_as_float(w.y << 16), x[4 * h + 3] = __uint_as_float(w.y & 0xFFFF0000u);
        }
    }
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(x[i]));
    m = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m)));
    const float f = m > 0.f ? 127.f / m : 0.f;
    uint8_t* const xq = PH == 0 ? p.xq : p.actq;
    if (ok) {
        uint8_t* q = xq + (int64_t(r) * nunits + u) * 64;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int hi, lo;
            int8_hi_lo(x[i] * f, hi, lo);
            const int slot = Dec::int8_tokens_slot(u & 7, (i >> 2) * 16 + v0 + (i & 3));
            const int at = 16 * ((slot & 15) >> 2) + 4 * (slot >> 4) + (slot & 3);
            q[at] = uint8_t(int8_t(hi));
            q[at + 8] = uint8_t(int8_t(lo));
        }
    }
    // (the decoder's factor left out of its integers: Q4_0's 1 / 16)
    if (l == 0) reinterpret_cast<float*>(xq + int64_t(rows) * nunits * 64)[wi] = m / 127.f / 254.f * Dec::kInt8TokensPost;
}

// Phase 1's row r of down without the bias: the parts of an item after its first (launch_staged
// splits down's items between blocks: each part adds its share of the dot product).
template <class Dec>
__device__ __forceinline__ void add_down_part(const KernelParams& p, int pair, int slot, int r, float acc) {
    atomicAdd(p.out + int64_t(pair / p.K) * p.H + r, p.topk_weights[pair] * (acc * Dec::post(p, 1, slot, r)));
}

// Optional, for byte streams: block_setup(), run by every thread of a block before its routing
// (whose barriers order it before any decode): gguf's IQ grids copied into shared memory; with
// kSetupAsync by cp.async, waited for after the routing (the copies' latency overlapping its).
FTW_HAS_MEMBER(HasBlockSetup, block_setup);
// block_setup_int8() (optional): the block's setup instead of block_setup() in the kOptInt8 kernel
FTW_HAS_MEMBER(HasInt8Setup, block_setup_int8);
FTW_OPTIONAL_MEMBER(SetupAsync, kSetupAsync, bool, false);
// kSetupLate (with kSetupAsync): the copies are waited for after the block's first S ring stages
// are in flight, not before (gguf's IQ grids in copies: 16-32 KB per block, whose fill would
// otherwise delay the first weight loads); kBlockWarps: the K split the launch takes (0: its rule;
// FTW_CUDA_STAGED_KSPLIT still forces one), for decoders whose per-block setup wants few blocks.
FTW_OPTIONAL_MEMBER(SetupLate, kSetupLate, bool, false);
FTW_OPTIONAL_MEMBER(BlockWarps, kBlockWarps, int, 0);

template <class Dec, int PH, int S, int OPT>
__global__ void __launch_bounds__(128, (OPT & kOptFine) != 0 && PH == 0              ? 6
                                      : ByteStream<Dec>::value || (OPT & kOptWide) != 0 ? 4
                                                                                        : 5)
    experts_decode_staged(const KernelParams p, const int nbands, const int cpw, const int nparts) {
    constexpr int V = Dec::VEC;
    constexpr int NR = V / 2;  // bf16x2 registers per 16-byte unit
    constexpr int NX = NR / 4;  // 16-byte loads of x per unit
    constexpr bool CS = HasChunkScale<Dec>::value;
    constexpr bool BS = ByteStream<Dec>::value;
    static_assert(!(BS && CS), "byte-stream rows carry their scales in the stream");
    constexpr int TR = (OPT & kOptRows32) != 0 ? 2 : 1;  // 16-row tiles per stage (and per item)
    constexpr int SU = StageShape<Dec>::kUnits * TR, PI = StageShape<Dec>::kPitch, NCOPY = StageShape<Dec>::kCopy;
    using Side = typename SideOf<Dec>::type;
    constexpr bool LEAN = (OPT & kOptLean) != 0 && !BS;
    constexpr bool AP = (OPT & kOptActPerm) != 0 && !BS && HasActPos<Dec>::value;
    constexpr bool EARLY = (OPT & kOptEarly) != 0;
    constexpr bool UC = (OPT & kOptUnitCols) != 0;
    constexpr bool BC = (OPT & kOptByteCols) != 0;  // (byte streams: UC's layout for their units)
    static_assert(!BC || (BS && ByteCols<Dec>::value && V == 32 && TR == 1),
                  "byte-stream unit columns: a byte-stream decoder with the interface");
    constexpr bool I8 = (OPT & kOptInt8) != 0;  // (the units as integers, x or act from quantize_int8)
    static_assert(!I8 || (BS && Int8Cols<Dec>::value && V == 32 && TR == 1 && !BC),
                  "int8 units: a byte-stream decoder with the interface");
    constexpr bool I8S = (OPT & kOptInt8Sums) != 0;  // (phase 0's sub-blocks as integers, x as for I8)
    static_assert(!I8S || (BS && Int8Sums<Dec>::value && TR == 1 && (PH == 0 || Int8SumsDown<Dec>::value) && !I8 &&
                           (OPT & (kOptLaneBlocks | kOptLanes16)) != 0),
                  "int8 sub-block sums: phase 0 (or where the decoder says, 1) of a lane-blocks decoder with the interface");
    constexpr bool I8T = (OPT & kOptInt8Tokens) != 0;  // (T = 2..8: x or act from quantize_int8_tokens)
    static_assert(!I8T || (BS && Int8Tokens<Dec>::value && V == 32 && TR == 1 && !BC && !I8 && !I8S &&
                           (OPT & kOptFull) != 0),
                  "int8 units of several tokens: a byte-stream decoder with the interface");
    constexpr bool XQ = I8 || I8S || I8T;  // (x or act from quantize_int8, quantize_int8_tokens)
    constexpr bool WC = (OPT & kOptWholeCopy) != 0;  // (not with LEAN: byte streams only)
    static_assert(!WC || (BS && (SubBlocks<Dec>::value || IntSums<Dec>::value)),
                  "whole-block copies: byte-stream rows of whole-block chunks (float32 sums)");
    constexpr int UG = UnitGroups<Dec>::value;  // kOptUnitCols: scale groups per unit (columns per lane)
    static_assert(!EARLY || LEAN, "early weights run the lean producer");
    static_assert(!UC || (LEAN && AP && !CS && HasUnitCols<Dec>::value && (UG == 1 || UG == 2)),
                  "unit columns: the lean producer, act in pair order, a decoder with the interface");
    static_assert(!UC || UG != 2 || NX % 2 == 0, "unit columns of two groups: whole x loads per group");
    static_assert(TR == 1 || (LEAN && !CS), "32-row stages: the lean producer of 16-byte units, no chunk scales");
    extern __shared__ uint4 s_dyn[];
    __shared__ StagedRouting rt;
    if (PH == 0 && !XQ) phase0_wait();  // (XQ: a dependent of quantize_int8, which waited; see below)

    const int KS = blockDim.x >> 5, ks = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const uint4* ring = s_dyn + ks * S * SU;
    const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
    // LEAN: the shared addresses of the units this lane decodes in stage 0 (rows g, + 8 rows: +1 KB)
    const uint32_t lds_unit[2] = {ring_s + (g * 8 + (tig ^ ((g & 1) << 2))) * 16,
                                  ring_s + (g * 8 + ((tig + 4) ^ ((g & 1) << 2))) * 16};
    float* red = reinterpret_cast<float*>(s_dyn + KS * S * SU);  // [KS - 1][4 TR][32]
    const int in = PH == 0 ? p.H : p.I;
    const int nunits = in / V;
    const int nchunks = (nunits + 7) >> 3;
    const int64_t wrow = Dec::weight_row_bytes(p, PH);
    int nmine = 0;  // this block's items, set by the routing (EARLY: 1 before it, for the first)
    const int cpad = (cpw + S - 1) / S * S;  // chunks per item in the ring: cpw, padded to whole rounds

    // Row t (0..15) of a 16-row tile b: phase 0 gate rows j0..j0+7 then up rows I+j0..I+j0+7
    // (so a lane's rows g and g + 8 are gate j and up j), phase 1 rows 16 b + t. An item's band
    // holds TR tiles (b = TR band + t / 16 for its row t).
    auto tile_row = [&](int band, int t, bool& ok) {
        const int b = band * TR + (t >> 4);
        t &= 15;
        int r;
        if (PH == 0) {
            const int j = b * 8 + (t & 7);
            ok = j < p.I;
            r = t < 8 ? j : p.I + j;
        } else {
            r = b * 16 + t;
            ok = r < p.H;
        }
        return ok ? r : 0;
    };
    // Item li of this block: distinct expert dx, band, and part (phase 1: parts of KS * cpw chunks;
    // this warp's first chunk of the item is returned in c0).
    auto item_of = [&](int li, int& band, int& c0) {
        int item = int(blockIdx.x) + li * int(gridDim.x), part = 0;
        if (PH == 1 && nparts > 1) {
            const int q = item / nparts;
            part = item - q * nparts;
            item = q;
        }
        const int dx = item / nbands;
        band = item - dx * nbands;
        c0 = (part * KS + ks) * cpw;
        return dx;
    };

    // Producer: the chunk S ahead of the consumer, (pli, pi). It copies rows (lane >> 3) + 4k,
    // units 8c + (lane & 7); it loads the sides (and chunk scales) of the units this lane will
    // decode: rows g, g + 8, units 8c + tig + 4j.
    int pli = 0, pi = 0, pslot = -1, pc0 = 0;
    int pnv = 0;  // LEAN: chunks of its item the producer copies (0: none, or the slot is bad)
    const uint8_t* pw[4 * TR];  // LEAN: with this lane's unit offset (lane & 7) * 16
    bool pwok[4 * TR];
    typename Dec::Row prow[2 * TR];  // rows g + 8 h
    typename ChunkRowOf<Dec>::type pcrow[2];  // chunk-scaled decoders: rows g, g + 8's scales
    Side side[S][2][2 * TR];  // [stage][j][h]
    float cscale[S][2][2];
    auto producer_at = [&](int slot, int band) {  // the producer's item (pc0 set): of `slot`, in `band`
        pslot = slot;
        if (pslot < 0) return;
        pnv = max(0, min(cpw, nchunks - pc0));
        const uint8_t* w = Dec::weights(p, PH, pslot);
#pragma unroll
        for (int k = 0; k < 4 * TR; ++k)
            pw[k] = w + tile_row(band, (lane >> 3) + 4 * k, pwok[k]) * wrow + (LEAN || WC ? (lane & 7) * 16 : 0);
#pragma unroll
        for (int h = 0; h < 2 * TR; ++h) {
            bool ok;
            const int r = tile_row(band, g + 8 * h, ok);
            prow[h] = Dec::row(p, PH, pslot, r);
            if constexpr (CS) pcrow[h] = Dec::chunk_row(p, PH, pslot, r);
        }
    };
    auto producer_item = [&]() {
        pnv = 0;
        if (pli >= nmine) return;
        int band;
        const int dx = item_of(pli, band, pc0);
        producer_at(rt.slot[dx], band);
    };
    auto produce = [&](int d) {  // issue stage d: the producer's chunk, then step the producer on
        const int c = pc0 + pi;
        if constexpr (LEAN) {
            if (pi < pnv) {
                // one offset for the lane's 4 TR copies (the same unit of 4 TR rows); a unit past the
                // row's end copies nothing, from the lane's unit of the chunk at offset 0
                const bool uok = c * 8 + (lane & 7) < nunits;
                const uint32_t off = uok ? uint32_t(c) * 128u : 0u;
                const uint32_t dst = ring_s + (d * SU + (lane >> 3) * 8 + ((lane & 7) ^ (((lane >> 3) & 1) << 2))) * 16;
#pragma unroll
                for (int k = 0; k < 4 * TR; ++k) cp_async16(dst + k * 512, pw[k] + off, uok && pwok[k] ? 16 : 0);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int uj = min(c * 8 + tig + 4 * j, nunits - 1);  // past the row: zero-filled weights
#pragma unroll
                    for (int h = 0; h < 2 * TR; ++h) {
                        side[d][j][h] = Dec::side(prow[h], uj);
                        if constexpr (CS)
                            cscale[d][j][h] = c * 8 + 4 * j < nunits ? Dec::chunk_scale(p, PH, pcrow[h], 2 * c + j) : 0.f;
                    }
                }
            }
        } else if constexpr (WC) {
            if (pi < pnv) {
                // piece v of row t's chunk: the 16 bytes at (pw[k] + chunk offset) & ~15, which
                // hold bytes 16 v - lo .. of the chunk (lo: the chunk's address mod 16); pieces
                // before the span's last always lie in it, the last only where 16 v - lo is
                // below the chunk's bytes (else 0 bytes, from the piece before it)
                const uint32_t off = uint32_t(c) * uint32_t(Dec::kChunkBytes);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = (lane >> 3) + 4 * k;
#pragma unroll
                    for (int m = 0; m < (NCOPY + 7) / 8; ++m) {
                        const int v = (lane & 7) + 8 * m;
                        if (NCOPY % 8 != 0 && v >= NCOPY) break;
                        const uintptr_t a = reinterpret_cast<uintptr_t>(pw[k] + 128 * m) + off;
                        const bool in = int(uint32_t(a) & 15u) > 16 * v - Dec::kChunkBytes;  // (v >= 1 where not)
                        const uintptr_t src = (a - (in ? 0u : 16u)) & ~uintptr_t(15);
                        cp_async16(ring_s + (d * SU + t * PI + v) * 16, reinterpret_cast<const void*>(src),
                                   in && pwok[k] ? 16 : 0);
                    }
                }
            }
        } else if (pli < nmine && pslot >= 0 && pi < cpw && c < nchunks) {
            if constexpr (BS) {
                // row t's chunk: the aligned 16-byte pieces from the one holding its first byte
                // up to the one holding its last (the row's last, for a partial last chunk)
                const int64_t cb = int64_t(c) * Dec::kChunkBytes, ce = min(cb + Dec::kChunkBytes, wrow);
                if constexpr ((OPT & kOptCopy32) != 0) {
                    // the pieces from the one holding the chunk's first byte to the one holding
                    // its last, counted in 32 bits; a copy past them reads the last (0 bytes)
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int t = (lane >> 3) + 4 * k;
                        const uint4* first = reinterpret_cast<const uint4*>(
                            reinterpret_cast<uintptr_t>(pw[k] + cb) & ~uintptr_t(15));
                        const uint32_t a0 = uint32_t(reinterpret_cast<uintptr_t>(first));
                        const uint32_t a1 = uint32_t(reinterpret_cast<uintptr_t>(pw[k] + ce - 1));
                        const int count = pwok[k] ? int(((a1 - a0) >> 4) + 1) : 0;
#pragma unroll
                        for (int m = 0; m < (NCOPY + 7) / 8; ++m) {
                            const int v = (lane & 7) + 8 * m;
                            if (NCOPY % 8 != 0 && v >= NCOPY) break;
                            const bool ok = v < count;
                            cp_async16(ring_s + (d * SU + t * PI + v) * 16, first + min(v, max(count - 1, 0)),
                                       ok ? 16 : 0);
                        }
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int t = (lane >> 3) + 4 * k;
                        const uintptr_t first = reinterpret_cast<uintptr_t>(pw[k] + cb) & ~uintptr_t(15);
                        const uintptr_t end = reinterpret_cast<uintptr_t>(pw[k] + ce);
#pragma unroll
                        for (int m = 0; m < (NCOPY + 7) / 8; ++m) {
                            const int v = (lane & 7) + 8 * m;
                            if (NCOPY % 8 != 0 && v >= NCOPY) break;
                            const uintptr_t src = first + 16 * v;
                            const bool ok = pwok[k] && src < end;
                            cp_async16(ring_s + (d * SU + t * PI + v) * 16,
                                       ok ? reinterpret_cast<const void*>(src) : pw[k], ok ? 16 : 0);
                        }
                    }
                }
            } else {
                const int u = c * 8 + (lane & 7);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = (lane >> 3) + 4 * k;
                    const bool ok = pwok[k] && u < nunits;
                    cp_async16(ring_s + (d * SU + t * 8 + ((lane & 7) ^ ((t & 1) << 2))) * 16,
                               pw[k] + (ok ? u : 0) * 16, ok ? 16 : 0);
                }
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int uj = c * 8 + tig + 4 * j;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if constexpr (!BS) side[d][j][h] = uj < nunits ? Dec::side(prow[h], uj) : Side{};
                    // every lane needs its rows' chunk scales, whether or not it holds a unit
                    if constexpr (CS)
                        cscale[d][j][h] = c * 8 + 4 * j < nunits ? Dec::chunk_scale(p, PH, pcrow[h], 2 * c + j) : 0.f;
                }
            }
        }
        cp_async_commit();  // an empty group for a padding chunk: the group count stays one per stage
        if (++pi == cpad) pi = 0, ++pli, producer_item();
    };
    auto prime = [&] {  // the first S chunks of the block's items in flight
        producer_item();
#pragma unroll
        for (int d = 0; d < S; ++d) produce(d);
    };
    // EARLY: the block's first item's expert, when it is token 0's k = dx < K (a token lists an
    // expert once), is known without the routing: its first S chunks are copied while the block
    // clears out and routes (-1: not known, or out of range or not resident).
    int early_slot = -1;
    if constexpr (EARLY) {
        int band;
        const int dx = item_of(0, band, pc0);
        const int e = dx < p.K ? p.topk_ids[dx] : -1;
        const int s = e >= 0 && e < p.num_experts ? p.slot_of_expert[e] : -1;
        if (s >= 0 && s < p.num_slots) {
            early_slot = s, nmine = 1;
            // as producer_item with the slot the routing will give (a stage past the first item
            // finds nmine = 1 and is set up again below)
            producer_at(s, band);
#pragma unroll
            for (int d = 0; d < S; ++d) produce(d);
        }
    }

    if (PH == 0) {  // phase 1 adds into out: clear it here, before any block leaves
        const int64_t n = int64_t(p.T) * p.H, stride = int64_t(gridDim.x) * blockDim.x;
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p.out[i] = 0.f;
    }
    if constexpr (I8 && HasInt8Setup<Dec>::value)  // the int8 units' own tables (gguf IQ2's byte grids)
        Dec::block_setup_int8();
    else if constexpr (HasBlockSetup<Dec>::value)
        Dec::block_setup();
    if constexpr (SetupAsync<Dec>::value) cp_async_commit();
    const int nexp = staged_route<PH>(p, rt);
    if constexpr (SetupAsync<Dec>::value && !SetupLate<Dec>::value) {  // every thread's copies landed, for every warp
        cp_async_wait<0>();
        __syncthreads();
    }
    // Phase 1 is launched as a programmatic dependent of phase 0 (launch_staged): its blocks may
    // start once every phase 0 block has passed this point, route, and put their first S chunks
    // of down weights in flight while phase 0 finishes; they wait for phase 0 (act, the cleared
    // out) just before their first chunk is consumed.
    // Phase 1 lets the next step's phase 0 start its blocks (where that is programmatic: phase0_wait).
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int items = nexp * nbands * nparts;
    nmine = int(blockIdx.x) < items ? (items - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    if (!EARLY || early_slot < 0) {
        prime();
    } else {
        int band, c0;
        if (nmine == 0 || rt.slot[item_of(0, band, c0)] != early_slot) {
            // the routing found another expert (a token listing one twice, only in an unchecked
            // step): let the early copies land, then start the ring over
            cp_async_wait<0>();
            __syncwarp();
            pli = 0, pi = 0;
            prime();
        } else if (pli > 0) {
            producer_item();  // the producer stepped past the first item before nmine was known
        }
    }
    if constexpr (SetupLate<Dec>::value) {  // the setup's group, older than the S ring stages just issued
        cp_async_wait<S>();
        __syncthreads();
    }
    if (PH == 1) asm volatile("griddepcontrol.wait;" ::: "memory");  // phase 0 complete, its writes visible
    // XQ: quantize_int8 complete (p.xq); every kernel before it was complete when it started
    if (PH == 0 && XQ) asm volatile("griddepcontrol.wait;" ::: "memory");

    for (int li = 0; li < nmine; ++li) {
        int band, c0;
        const int dx = item_of(li, band, c0);
        const bool first_part = c0 < KS * cpw;  // phase 1: the part that adds the bias
        const int slot = rt.slot[dx];
        const int count = slot >= 0 ? rt.count[dx] : 0;
        const __nv_bfloat16* xrow = nullptr;
        if constexpr (UC || BC) {
            // T = 1: every pair of the item is token 0's; the lanes g = 2 tig supply column g, the
            // others keep x zero (two groups per unit: the lanes g = 2 tig + 1 too, column g taking
            // the unit's second group; BC's units are one group)
            if (count > 0 && (UG == 2 ? g >> 1 : g) == (UG == 2 ? tig : 2 * tig)) {
                const int pair = rt.pairs[dx][0];
                xrow = PH == 0 ? p.x + int64_t(pair / p.K) * p.H : p.act + int64_t(pair) * p.I;
            }
        } else if (!I8 && g < count) {
            const int pair = rt.pairs[dx][g];
            xrow = PH == 0 ? p.x + int64_t(pair / p.K) * p.H : p.act + int64_t(pair) * p.I;
        }
        // sub-block decoders: lanes without a pair read the first pair's x (their mma columns are
        // dropped), so that x's loads need no predicate
        const __nv_bfloat16* xsub = xrow;
        if ((SubBlocks<Dec>::value || IntSums<Dec>::value) && xsub == nullptr && count > 0) {
            const int pair = rt.pairs[dx][0];
            xsub = PH == 0 ? p.x + int64_t(pair / p.K) * p.H : p.act + int64_t(pair) * p.I;
        }
        uint32_t rlow[2] = {0u, 0u};  // byte streams: global address mod 16 of rows g, g + 8
        if constexpr (BS) {
            if (count > 0) {
                const uint8_t* w = Dec::weights(p, PH, slot);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    bool ok;
                    rlow[h] = uint32_t(reinterpret_cast<uintptr_t>(w + tile_row(band, g + 8 * h, ok) * wrow)) & 15u;
                }
            }
        }
        // LEAN: the item's chunks this warp computes, as one count (0: none, or the slot is bad)
        const int nv = count > 0 ? max(0, min(cpw, nchunks - c0)) : 0;
        float acc[TR][4] = {};  // per 16-row tile of the stage
        // I8: the B lanes (2 tig + e, tig) read unit u's x, hi (e = 0) or lo, at xq8 + 4 u (phase 1:
        // the item's pair's act groups); the others keep zeros; every lane its float2 at xmeta + u
        const uint4* xq8 = nullptr;
        const float2* xmeta = nullptr;
        if constexpr (I8) {
            const int gb = PH == 0 || count == 0 ? 0 : rt.pairs[dx][0] * nunits;  // the item's first group
            const uint8_t* xqb = PH == 0 ? p.xq : p.actq;
            xmeta = reinterpret_cast<const float2*>(xqb + int64_t(PH == 0 ? nunits : p.K * nunits) * 64) + gb;
            if (count > 0 && (g >> 1) == tig) xq8 = reinterpret_cast<const uint4*>(xqb) + 4 * gb + 2 * (g & 1);
        }
        // I8S: the same B lanes and planes of x (phase 1: the item's pair's act; the groups
        // staged_sub_block_int8 says), every lane its groups' float2 pairs at xm4 + 4 c (kOptLanes16's
        // body; the one-column body's, phase 0 only, finds them at p.xq's end itself)
        const float4* xm4 = nullptr;
        if constexpr (I8S) {
            const int gb = PH == 0 || count == 0 ? 0 : rt.pairs[dx][0] * (in / 32);  // the item's first group
            const uint8_t* xqb = PH == 0 ? p.xq : p.actq;
            xm4 = reinterpret_cast<const float4*>(xqb + int64_t(PH == 0 ? in / 32 : p.K * (in / 32)) * 64) + gb / 2;
            if (count > 0 && (g >> 1) == tig) xq8 = reinterpret_cast<const uint4*>(xqb) + 4 * gb + 2 * (g & 1);
        }
        // I8T: lane (g, tig) reads its B words of pair g's units at xt + 4 u (pair 0's past the
        // item's pairs: their columns are dropped), and the chunk scales of its columns' pairs 2 tig,
        // 2 tig + 1 at xs0, xs1 + c
        const uint4* xt = nullptr;
        const float* xs0 = nullptr;
        const float* xs1 = nullptr;
        if constexpr (I8T) {
            if (count > 0) {
                const uint8_t* xqb = PH == 0 ? p.xq : p.actq;
                auto qrow = [&](int q) {  // the quantized row of the item's pair q (pair 0's past them)
                    const int pair = rt.pairs[dx][q < count ? q : 0];
                    return PH == 0 ? pair / p.K : pair;
                };
                xt = reinterpret_cast<const uint4*>(xqb + int64_t(qrow(g)) * nunits * 64) + tig;
                const float* sc = reinterpret_cast<const float*>(xqb + int64_t(PH == 0 ? p.T : p.T * p.K) * nunits * 64);
                xs0 = sc + int64_t(qrow(2 * tig)) * nchunks;
                xs1 = sc + int64_t(qrow(2 * tig + 1)) * nchunks;
            }
        }
        uint4 xv[NX];  // lanes without a pair keep zeros (their mma columns are dropped anyway)
#pragma unroll
        for (int k = 0; k < NX; ++k) xv[k] = make_uint4(0, 0, 0, 0);

        for (int i0 = 0; i0 < cpad; i0 += S) {
#pragma unroll
            for (int d = 0; d < S; ++d) {
                const int i = i0 + d, c = c0 + i;
                cp_async_wait<S - 1>();  // this lane's copies of stage d have landed
                __syncwarp();            // and every other lane's
                if (LEAN ? i < nv : count > 0 && i < cpw && c < nchunks) {  // warp-uniform
                    // the chunk's units; full: every unit lies in the row (kOptFull: no per-lane
                    // check, so the stage's decodes and mma chains are one block to schedule)
                    auto chunk = [&](auto full) {
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            const int uj = c * 8 + tig + 4 * j;
                            if constexpr (I8) {
                                // the unit as integers, rows g and g + 8 into the A fragment; columns
                                // 2 tig (x hi) and 2 tig + 1 (x lo) sum it alone
                                const int ux = min(uj, nunits - 1);  // a unit past the row: zero weights
                                uint4 xb0 = make_uint4(0, 0, 0, 0), xb1 = make_uint4(0, 0, 0, 0);
                                if (xq8 != nullptr) xb0 = __ldg(xq8 + 4 * ux), xb1 = __ldg(xq8 + 4 * ux + 1);  // B words b0, b1
                                const float2 xm = __ldg(xmeta + ux);
                                const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                                const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
                                uint32_t a[2][8];
                                float us[2];
                                int f[2][2];  // kInt8Halves: the halves' integer scales per row
#pragma unroll
                                for (int h = 0; h < 2; ++h) {
                                    if (decltype(full)::value || uj < nunits) {
                                        const uint8_t* b = sb + (g + 8 * h) * PI * 16 + ((rlow[h] + cl) & 15u);
                                        if constexpr (Int8Halves<Dec>::value)
                                            us[h] = Dec::decode_int8_halves(b, tig + 4 * j, a[h], f[h]);
                                        else
                                            us[h] = Dec::decode_int8(b, tig + 4 * j, a[h]);
                                    } else {
                                        us[h] = 0.f, f[h][0] = f[h][1] = 0;
#pragma unroll
                                        for (int k = 0; k < 8; ++k) a[h][k] = 0u;
                                    }
                                }
                                if constexpr (Int8Halves<Dec>::value) {
                                    // values 0..15 (a[2 s]: k 4 tig ..) and 16..31 (a[2 s + 1]: k 16 +
                                    // 4 tig ..) in two chains, each with the other half of A zero;
                                    // s8 (no offset: the halves' x sums are not at hand)
                                    int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                                    const uint32_t bx[4] = {xb0.x, xb0.y, xb0.z, xb0.w}, by[4] = {xb1.x, xb1.y, xb1.z, xb1.w};
#pragma unroll
                                    for (int s = 0; s < 4; ++s) {
                                        imma_s8s8(s0, a[0][2 * s], a[1][2 * s], 0u, 0u, bx[s], by[s]);
                                        imma_s8s8(s1, 0u, 0u, a[0][2 * s + 1], a[1][2 * s + 1], bx[s], by[s]);
                                    }
                                    const int i0 = f[0][0] * (254 * s0[0] + s0[1]) + f[0][1] * (254 * s1[0] + s1[1]);
                                    const int i1 = f[1][0] * (254 * s0[2] + s0[3]) + f[1][1] * (254 * s1[2] + s1[3]);
                                    acc[0][0] = fmaf(float(i0), us[0] * xm.x, acc[0][0]);
                                    acc[0][2] = fmaf(float(i1), us[1] * xm.x, acc[0][2]);
                                    continue;
                                }
                                int sum[4] = {0, 0, 0, 0};
                                imma_u8s8(sum, a[0][0], a[1][0], a[0][1], a[1][1], xb0.x, xb1.x);
                                imma_u8s8(sum, a[0][2], a[1][2], a[0][3], a[1][3], xb0.y, xb1.y);
                                imma_u8s8(sum, a[0][4], a[1][4], a[0][5], a[1][5], xb0.z, xb1.z);
                                imma_u8s8(sum, a[0][6], a[1][6], a[0][7], a[1][7], xb0.w, xb1.w);
                                const int off = Dec::kInt8Offset * __float_as_int(xm.y);
                                acc[0][0] = fmaf(float(254 * sum[0] + sum[1] - off), us[0] * xm.x, acc[0][0]);
                                acc[0][2] = fmaf(float(254 * sum[2] + sum[3] - off), us[1] * xm.x, acc[0][2]);
                                continue;
                            }
                            if (UC && UG == 2 && xrow != nullptr) {
                                // two groups, two columns: lane g = 2 tig loads the unit's first
                                // group's x, g = 2 tig + 1 its second; the other half of xv stays
                                // zero from the item's start (the loads are predicated, not selected)
                                const uint4* src = reinterpret_cast<const uint4*>(xrow + int64_t(min(uj, nunits - 1)) * V);
#pragma unroll
                                for (int k = 0; k < NX; ++k) ldg_if((g & 1) == (k >= NX / 2), src + k, xv[k]);
                            } else if (xrow != nullptr) {  // a unit past the row reads the last one: finite x, zero weights
                                const uint4* src = reinterpret_cast<const uint4*>(xrow + int64_t(min(uj, nunits - 1)) * V);
#pragma unroll
                                for (int k = 0; k < NX; ++k) xv[k] = __ldg(src + k);
                            } else if constexpr (BS) {  // x dead after permute: registers for the decode
#pragma unroll
                                for (int k = 0; k < NX; ++k) xv[k] = make_uint4(0, 0, 0, 0);
                            }
                            uint32_t xr[NR], xa[NR];
#pragma unroll
                            for (int k = 0; k < NX; ++k) {
                                xr[4 * k] = xv[k].x, xr[4 * k + 1] = xv[k].y;
                                xr[4 * k + 2] = xv[k].z, xr[4 * k + 3] = xv[k].w;
                            }
                            if constexpr (AP && PH == 1) {  // act is stored in the pair order
#pragma unroll
                                for (int k = 0; k < NR; ++k) xa[k] = xr[k];
                            } else {
                                Dec::permute(xr, xa);
                                // x * 2^kUnitColsX (UC: phase 1's act is stored so; BC: where kByteColsX)
                                if constexpr (UC || (BC && ByteColsX<Dec>::value))
#pragma unroll
                                    for (int k = 0; k < NR; ++k) xa[k] = hmul2(xa[k], kUnitColsXBf16x2);
                            }
                            if constexpr (BC) {
                                // the unit unscaled, rows g and g + 8 into the two halves of the A
                                // fragment; column 2 tig sums it alone (x from lane g = 2 tig only)
                                const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                                const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
                                uint32_t w[2][NR];
                                float us[2];  // the unit's scale per row (0 past the row: its x is the last unit's)
#pragma unroll
                                for (int h = 0; h < 2; ++h) {
                                    if (decltype(full)::value || uj < nunits) {
                                        const uint8_t* b = sb + (g + 8 * h) * PI * 16 + ((rlow[h] + cl) & 15u);
                                        us[h] = Dec::decode_cols(b, tig + 4 * j, w[h]);
                                    } else {
                                        us[h] = 0.f;
#pragma unroll
                                        for (int k = 0; k < NR; ++k) w[h][k] = 0u;
                                    }
                                }
                                float sum[4];
                                mma_bf16_zero(sum, w[0][0], w[1][0], w[0][1], w[1][1], xa[0], xa[1]);
#pragma unroll
                                for (int s = 1; s < V / 4; ++s)
                                    mma_bf16_acc(sum, w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1],
                                                 xa[2 * s], xa[2 * s + 1]);
                                acc[0][0] = fmaf(sum[0], us[0], acc[0][0]);
                                acc[0][2] = fmaf(sum[2], us[1], acc[0][2]);
                            } else if constexpr (BS) {
                                // Rows g and g + 8 decoded one after the other into the two halves of
                                // the A fragment, then one mma chain (8 mma per 32 values).
                                const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                                const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
                                uint32_t w[2][NR];
#pragma unroll
                                for (int h = 0; h < 2; ++h) {
                                    if (decltype(full)::value || uj < nunits) {  // else the bytes may be the next row's
                                        const uint8_t* b = sb + (g + 8 * h) * PI * 16 + ((rlow[h] + cl) & 15u);
                                        Dec::decode_staged(b, tig + 4 * j, w[h]);
                                    } else {
#pragma unroll
                                        for (int k = 0; k < NR; ++k) w[h][k] = 0u;
                                    }
                                }
#pragma unroll
                                for (int s = 0; s < V / 4; ++s)
                                    mma_bf16(acc[0], w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1],
                                             xa[2 * s], xa[2 * s + 1]);
                            } else {
                                const int su = (tig + 4 * j) ^ ((g & 1) << 2);  // swizzled unit of rows g and g + 8
#pragma unroll
                                for (int tt = 0; tt < TR; ++tt) {  // the stage's 16-row tiles, one x
                                    uint4 ua, ub;
                                    if constexpr (LEAN) {  // the lane's ring addresses, found once (lds_unit)
                                        ua = ld_shared_v4(lds_unit[j] + (d * SU + tt * 128) * 16);
                                        ub = ld_shared_v4(lds_unit[j] + (d * SU + tt * 128 + 64) * 16);
                                    } else {
                                        ua = ring[d * SU + g * 8 + su], ub = ring[d * SU + (g + 8) * 8 + su];
                                    }
                                    uint32_t wa[NR], wb[NR];
                                    if constexpr (UC && UG == 2) {
                                        // two groups in columns 2 tig and 2 tig + 1 of one mma chain (x
                                        // of the first group from lane g = 2 tig, of the second from
                                        // g = 2 tig + 1): lane (g, tig) gets its unit's group sums of
                                        // rows g (sum[0], sum[1]) and g + 8 (sum[2], sum[3])
                                        Dec::decode_raw(ua, wa);
                                        Dec::decode_raw(ub, wb);
                                        float fa[2], fb[2], sum[4];
                                        Dec::group_scales(side[d][j][2 * tt], fa);
                                        Dec::group_scales(side[d][j][2 * tt + 1], fb);
                                        mma_bf16_zero(sum, wa[0], wb[0], wa[1], wb[1], xa[0], xa[1]);
#pragma unroll
                                        for (int s = 1; s < V / 4; ++s)
                                            mma_bf16_acc(sum, wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1], xa[2 * s],
                                                         xa[2 * s + 1]);
                                        acc[tt][0] = fmaf(sum[0], fa[0], acc[tt][0]);
                                        acc[tt][1] = fmaf(sum[1], fa[1], acc[tt][1]);
                                        acc[tt][2] = fmaf(sum[2], fb[0], acc[tt][2]);
                                        acc[tt][3] = fmaf(sum[3], fb[1], acc[tt][3]);
                                        continue;
                                    } else if constexpr (UC) {  // one scale per unit (E8M0): each group's sums (one mma chain each), then its scale
                                        Dec::decode_raw(ua, wa);
                                        Dec::decode_raw(ub, wb);
                                        float fa[UG], fb[UG];
                                        Dec::group_scales(side[d][j][2 * tt], fa);
                                        Dec::group_scales(side[d][j][2 * tt + 1], fb);
                                        constexpr int SG = V / 4 / UG;  // mma steps per group
#pragma unroll
                                        for (int q = 0; q < UG; ++q) {
                                            float sum[4];
                                            mma_bf16_zero(sum, wa[2 * SG * q], wb[2 * SG * q], wa[2 * SG * q + 1],
                                                          wb[2 * SG * q + 1], xa[2 * SG * q], xa[2 * SG * q + 1]);
#pragma unroll
                                            for (int s = SG * q + 1; s < SG * (q + 1); ++s)
                                                mma_bf16_acc(sum, wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1],
                                                             xa[2 * s], xa[2 * s + 1]);
                                            // column 2 tig: rows g (sum[0]) and g + 8 (sum[2]); the
                                            // groups into accumulators of their own (summed per item)
                                            acc[tt][q] = fmaf(sum[0], fa[q], acc[tt][q]);
                                            acc[tt][2 + q] = fmaf(sum[2], fb[q], acc[tt][2 + q]);
                                        }
                                        continue;
                                    }
                                    staged_decode_unit<Dec, OPT>(Dec::raw(ua, side[d][j][2 * tt]), wa);
                                    staged_decode_unit<Dec, OPT>(Dec::raw(ub, side[d][j][2 * tt + 1]), wb);
                                    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                                    for (int s = 0; s < V / 4; ++s)
                                        mma_bf16(CS ? part : acc[tt], wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1],
                                                 xa[2 * s], xa[2 * s + 1]);
                                    if constexpr (CS) {
                                        const float s0 = cscale[d][j][0], s1 = cscale[d][j][1];
                                        acc[0][0] += part[0] * s0, acc[0][1] += part[1] * s0;
                                        acc[0][2] += part[2] * s1, acc[0][3] += part[3] * s1;
                                    }
                                }
                            }
                        }
                    };
                    if constexpr (SubBlocks<Dec>::value) {  // (whole blocks: every chunk is full)
                        const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                        const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
                        const uint8_t* b0 = sb + g * PI * 16 + ((rlow[0] + cl) & 15u);
                        const uint8_t* b1 = sb + (g + 8) * PI * 16 + ((rlow[1] + cl) & 15u);
                        const __nv_bfloat16* xc = xsub + int64_t(c) * 256 + kSubBlockLaneValues<Dec> * tig;
                        if constexpr ((OPT & kOptLanes16) != 0 && I8S) {
                            if (count == 1)  // (warp-uniform) the B lanes (2 tig + h, tig): x's (act's) plane h
                                staged_sub_block_int8<Dec>(b0, b1, xq8 != nullptr ? xq8 + 32 * c : nullptr, xm4 + 4 * c, tig, acc[0]);
                            else
                                staged_sub_block_chunk<Dec>(b0, b1, xc, tig, acc[0]);
                        } else if constexpr ((OPT & kOptLanes16) != 0) {
                            if (count == 1)  // (warp-uniform) the B lanes (2 tig + e, tig): x
                                staged_sub_block_lanes16<Dec>(
                                    b0, b1,
                                    (g >> 1) == tig ? xsub + int64_t(c) * 256 + 128 * (tig >> 1) + 16 * (tig & 1) + 32 * (g & 1)
                                                    : lane_zeros(),
                                    tig, acc[0]);
                            else
                                staged_sub_block_chunk<Dec>(b0, b1, xc, tig, acc[0]);
                        } else if constexpr ((OPT & kOptOneColumn) != 0) {
                            if (count == 1) {  // (warp-uniform)
                                if constexpr (I8S)  // the B lanes (2 tig + h, tig): x's plane h, from p.xq
                                    staged_sub_block_int8<Dec>(
                                        b0, b1, xq8 != nullptr ? xq8 + 32 * c : nullptr,
                                        reinterpret_cast<const float4*>(p.xq + int64_t(p.H / 32) * 64) + 4 * c, tig, acc[0]);
                                else if constexpr ((OPT & kOptLaneCols) != 0)  // the B lanes (2 tig + e, tig): x
                                    staged_sub_block_lane_cols<Dec>(
                                        b0, b1, (g >> 1) == tig ? xsub + int64_t(c) * 256 + 32 * g : lane_zeros(), tig, acc[0]);
                                else if constexpr ((OPT & kOptLaneBlocks) != 0)  // the B lanes (2 tig, tig): x
                                    staged_sub_block_lanes<Dec>(
                                        b0, b1, g == 2 * tig ? xsub + int64_t(c) * 256 + 64 * tig : lane_zeros(), tig, acc[0]);
                                else
                                    staged_sub_block_chunk<Dec, true>(b0, b1, xc, tig, acc[0]);
                            } else {
                                staged_sub_block_chunk<Dec>(b0, b1, xc, tig, acc[0]);
                            }
                        } else if constexpr (Aligned4<Dec>::value) {
                            // every lane's two blocks on a 4-byte boundary: the aligned body
                            const uint32_t lows = uint32_t(reinterpret_cast<uintptr_t>(b0) | reinterpret_cast<uintptr_t>(b1));
                            if (__all_sync(0xffffffffu, (lows & 3u) == 0))
                                staged_sub_block_chunk<Dec, false, true>(b0, b1, xc, tig, acc[0]);
                            else
                                staged_sub_block_chunk<Dec>(b0, b1, xc, tig, acc[0]);
                        } else {
                            staged_sub_block_chunk<Dec>(b0, b1, xc, tig, acc[0]);
                        }
                    } else if constexpr (IntSums<Dec>::value && !I8) {  // (whole blocks, as above; I8: the units below)
                        const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                        const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
                        staged_int_sum_chunk<Dec>(sb + g * PI * 16 + ((rlow[0] + cl) & 15u),
                                                  sb + (g + 8) * PI * 16 + ((rlow[1] + cl) & 15u),
                                                  xsub + int64_t(c) * 256, tig, acc[0]);
                    } else if constexpr (I8T) {
                        {  // (every chunk whole, every row on a 16-byte boundary: int8_tokens_rows)
                            // the chunk's 8 units, each one IMMA k32 for the hi plane and one for
                            // the lo plane of the item's pairs (column n: pair n); x in two halves of
                            // 4 units, the first in flight over the rows' reads (all 8 at once: the
                            // kernel with a bf16 body beside this one spilled around it)
                            uint4 xb[4];
#pragma unroll
                            for (int u = 0; u < 4; ++u) xb[u] = __ldg(xt + 4 * (c * 8 + u));
                            const float s0 = __ldg(xs0 + c), s1 = __ldg(xs1 + c);
                            const uint8_t* sb = reinterpret_cast<const uint8_t*>(ring + d * SU);
                            // the units' scales as floats, or as integers (kInt8TokensIntScales:
                            // the hi and lo planes' sums times them in int32, |sum| <= 8 units x 32
                            // x 127 x 127 x 32 < 2^31, each plane once per chunk to float)
                            constexpr bool IS = Int8TokensIntScales<Dec>::value;
                            using UnitScale = std::conditional_t<IS, int, float>;
                            uint32_t aw[2][8];
                            UnitScale dv[2][8];
                            float rf[2];
                            // (chunks of a multiple of 16 bytes start on a 16-byte boundary: int8_tokens_rows)
                            const uint32_t cl = uint32_t(c) * uint32_t(Dec::kChunkBytes);
#pragma unroll
                            for (int h = 0; h < 2; ++h)
                                rf[h] = Dec::int8_tokens_row(
                                    sb + (g + 8 * h) * PI * 16 + (Dec::kChunkBytes % 16 == 0 ? 0u : (rlow[h] + cl) & 15u), tig,
                                    aw[h], dv[h]);
                            float cs[4] = {0.f, 0.f, 0.f, 0.f};
                            int ih[4] = {0, 0, 0, 0}, il[4] = {0, 0, 0, 0};  // (IS)
#pragma unroll
                            for (int u = 0; u < 8; ++u) {
                                if (u == 4)
#pragma unroll
                                    for (int v = 0; v < 4; ++v) xb[v] = __ldg(xt + 4 * (c * 8 + 4 + v));
                                uint32_t lo0, hi0, lo1, hi1;
                                Dec::int8_tokens_split(aw[0][u], lo0, hi0);
                                Dec::int8_tokens_split(aw[1][u], lo1, hi1);
                                int sh[4] = {0, 0, 0, 0}, sl[4] = {0, 0, 0, 0};
                                imma_s8s8(sh, lo0, lo1, hi0, hi1, xb[u & 3].x, xb[u & 3].y);
                                imma_s8s8(sl, lo0, lo1, hi0, hi1, xb[u & 3].z, xb[u & 3].w);
#pragma unroll
                                for (int i = 0; i < 4; ++i) {
                                    if constexpr (IS)
                                        ih[i] += sh[i] * dv[i >> 1][u], il[i] += sl[i] * dv[i >> 1][u];
                                    else
                                        cs[i] = fmaf(float(254 * sh[i] + sl[i]), dv[i >> 1][u], cs[i]);
                                }
                            }
                            if constexpr (IS)
#pragma unroll
                                for (int i = 0; i < 4; ++i) cs[i] = fmaf(254.f, float(ih[i]), float(il[i]));
                            acc[0][0] = fmaf(cs[0], s0 * rf[0], acc[0][0]);
                            acc[0][1] = fmaf(cs[1], s1 * rf[0], acc[0][1]);
                            acc[0][2] = fmaf(cs[2], s0 * rf[1], acc[0][2]);
                            acc[0][3] = fmaf(cs[3], s1 * rf[1], acc[0][3]);
                        }
                    } else if constexpr (BS && (OPT & kOptFull) != 0) {
                        if ((c + 1) * 8 <= nunits)
                            chunk(std::true_type{});
                        else
                            chunk(std::false_type{});
                    } else {
                        chunk(std::false_type{});
                    }
                }
                __syncwarp();  // every lane has read stage d before it is refilled
                produce(d);
            }
        }

        // kOptLaneBlocks and kOptLanes16, an item of one pair: the quad's sub-block sums of rows g
        // and g + 8 (pair column 0: lane tig 0's acc 0 and 2; every lane holds them)
        if constexpr ((OPT & (kOptLaneBlocks | kOptLanes16)) != 0) {
            if (count == 1) {  // (warp-uniform)
#pragma unroll
                for (int m = 1; m < 4; m <<= 1) {
                    acc[0][0] += __shfl_xor_sync(0xffffffffu, acc[0][0], m);
                    acc[0][2] += __shfl_xor_sync(0xffffffffu, acc[0][2], m);
                }
            }
        }
        // UC, BC, I8: the row sums of the quad's units (every lane then holds them, for any pair q at T = 1)
        if constexpr (UC || BC || I8) {
#pragma unroll
            for (int tt = 0; tt < TR; ++tt) {
                float v0 = acc[tt][0] + acc[tt][1], v1 = acc[tt][2] + acc[tt][3];
#pragma unroll
                for (int m = 1; m < 4; m <<= 1) {
                    v0 += __shfl_xor_sync(0xffffffffu, v0, m);
                    v1 += __shfl_xor_sync(0xffffffffu, v1, m);
                }
                if constexpr (UnitColsPost<Dec>::value != 1.f) v0 *= UnitColsPost<Dec>::value, v1 *= UnitColsPost<Dec>::value;
                acc[tt][0] = acc[tt][1] = v0;
                acc[tt][2] = acc[tt][3] = v1;
            }
        }
        // The item's K-split reduction into warp 0, then its epilogue (the others run on).
        if (KS > 1) {
            __syncthreads();  // warp 0 is done with the previous item's partials
            if (ks > 0)
#pragma unroll
                for (int tt = 0; tt < TR; ++tt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) red[((ks - 1) * 4 * TR + 4 * tt + i) * 32 + lane] = acc[tt][i];
            __syncthreads();
        }
        if (ks == 0 && count > 0) {
            for (int k = 0; k < KS - 1; ++k)
#pragma unroll
                for (int tt = 0; tt < TR; ++tt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[tt][i] += red[(k * 4 * TR + 4 * tt + i) * 32 + lane];
            // Accumulator i of tile tt: row g + 8*(i/2) of the tile, pair slot 2*tig + (i&1).
#pragma unroll
            for (int tt = 0; tt < TR; ++tt) {
                const int b = band * TR + tt;  // the 16-row tile
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int q = 2 * tig + e;
                    if (q >= count) continue;
                    const int pair = rt.pairs[dx][q];
                    if (PH == 0) {
                        const int j = b * 8 + g;
                        if (j < p.I) {
                            if constexpr (AP)
                                store_activation<Dec>(p, pair, slot, j, acc[tt][e], acc[tt][2 + e], Dec::act_pos(j),
                                                      UC ? __uint_as_float(uint32_t(127 + kUnitColsX) << 23) : 1.f);
                            else
                                store_activation<Dec>(p, pair, slot, j, acc[tt][e], acc[tt][2 + e]);
                        }
                    } else {
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int r = b * 16 + g + 8 * h;
                            if (r >= p.H) continue;
                            if (first_part)
                                add_down_row<Dec>(p, pair, slot, r, acc[tt][2 * h + e]);
                            else
                                add_down_part<Dec>(p, pair, slot, r, acc[tt][2 * h + e]);
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
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
    // rows of this lane's accumulator columns (2tig, 2tig+1) per n-tile, for chunk scales (their
    // ChunkRow is found per chunk: kept per row, it spills here)
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
                    const float s0 = Dec::chunk_scale(p, PH, Dec::chunk_row(p, PH, slot, crow[n][0]), c);
                    const float s1 = Dec::chunk_scale(p, PH, Dec::chunk_row(p, PH, slot, crow[n][1]), c);
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

// The switches the benchmarks and tests set (FTW_CUDA_*, FTW_GGUF_CUDA_*): environment variables
// read at every launch, so that one process can time or test several settings in one run (a
// captured graph keeps the kernels chosen when it was captured). Not cached, because a read is
// cheap: glibc's getenv took 12.7 ns a call over 39 variables (dev machine, g++ -O2, 2 million
// calls, 2026-12-01), so even all ~60 read sites of the CUDA sources in one launch would cost
// under a microsecond of host time, and none in a graph's replays.
inline const char* env_or(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : fallback;
}
inline bool env_is(const char* name, const char* value) { return std::strcmp(env_or(name, ""), value) == 0; }
inline int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::atoi(v) : fallback;
}

// A power of two from 1 to `most` forced by environment variable `name` (benchmarks compare
// launch shapes in one run), or 0 when unset.
inline int forced_split(const char* name, int most) {
    const int n = env_int(name, 0);
    return n >= 1 && n <= most && (n & (n - 1)) == 0 ? n : 0;
}

// The device's SM count, for launch shapes; without a usable device 1 (the launch then reports
// the error).
inline int device_sms() {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
        sms = 1;
    return sms;
}

// Warps splitting one row in experts_decode, for a grid of `blocks` blocks (or FTW_CUDA_KSPLIT's).
// A warp's loads run best in long streams, so as few as put about 8 warps per SM to work, but
// enough that no warp reads more than 56 4-unit chunks of a row, and at least 2 (a block of one
// warp pays the block's routing for one warp's loads; deepseek-v3 fp8_block down: 0.53x of the
// ceiling with 2 warps in both phases, 0.47x with 1 in down). Measured on the H200 against every
// fixed split, then as the rule (docs/BENCHMARKS.md, "Launch shapes"): deepseek-v3 bf16 0.77x ->
// 0.82x, fp8_block 0.46x -> 0.49x; qwen3 sizes take 2-4 warps per block. It still holds with two
// tiles per warp (fp8_block's RegisterShape, half the blocks): deepseek-v3 2 warps 0.77x, 4
// 0.71x; qwen3 the rule's 4 0.55x, 2 0.46x ("Register-fed decode shapes").
inline int k_split(int in, int vec, int blocks, int sms) {
    if (const int forced = forced_split("FTW_CUDA_KSPLIT", kMaxKSplit)) return forced;
    const int chunks = (in / vec + 3) / 4;
    int ks = 2;
    while (ks < kMaxKSplit && (int64_t(blocks) * ks < 8LL * sms || chunks / ks > 56)) ks *= 2;
    return ks;
}

// FTW_CUDA_PDL=0 launches phase 1 of the staged decode after phase 0 completes (no programmatic
// dependent launch), for comparison.
inline bool programmatic_launch() { return !env_is("FTW_CUDA_PDL", "0"); }

// Phase 0 of a decode step as a programmatic dependent of the stream's previous kernel (its blocks
// wait in phase0_wait; both decode kernels' phase 1 lets it start once its blocks have routed).
// Measured on the H200 (T = 1, against the default in the same run; docs/BENCHMARKS.md, "QW"):
// slower for the staged kernel (nvfp4 0.94x the speed at both sizes, mxfp8 0.96x at deepseek-v3),
// 0.97x-1.02x for the register-fed one: off by default. FTW_CUDA_PDL0=1 on (benchmarks, tests).
inline bool phase0_programmatic() { return env_is("FTW_CUDA_PDL0", "1"); }

// FTW_CUDA_ONLY_PHASE=0|1: launch only that phase of a decode step, for timing where a step's
// time goes (the step's output is then wrong: benchmarks only).
inline bool decode_phase_skipped(int PH) {
    const char* v = std::getenv("FTW_CUDA_ONLY_PHASE");
    return v != nullptr && (v[0] == '0' || v[0] == '1') && v[0] - '0' != PH;
}

// A kernel launch, as a programmatic dependent of the stream's previous kernel where
// `programmatic` (its blocks may start while that kernel's last blocks run; the kernel itself
// waits with griddepcontrol.wait before it reads what that kernel writes).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t stream, bool programmatic,
                   const Args&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    if (programmatic) cfg.attrs = attr, cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

// FTW_CUDA_REGISTER_SHAPE=legacy: the register-fed decode of every decoder with a RegisterShape in
// the legacy loop (benchmarks compare them in one run; read at every launch).
// Early weights: a decode block puts its first expert's first chunks in flight before the routing
// (experts_decode's Early, the staged kernel's kOptEarly). By measurement (H200, T=1, x the
// ceiling; docs/BENCHMARKS.md, "Main after the fourth session's merges"): on by default for the
// register-fed kernel (qwen3-30b-a3b fp8_block 0.57 -> 0.61 and 0.58 -> 0.62 in two runs;
// deepseek-v3 equal) where its decoder does not opt out (kEarlyWeights = false: bf16, whose two
// runs disagreed), off for the staged one (qwen3-30b-a3b fp4 4-5% slower, mxfp8 equal).
// FTW_CUDA_EARLY_WEIGHTS=1 turns it on for both, =0 off for both (benchmarks, tests).
FTW_OPTIONAL_MEMBER(EarlyWeightsDefault, kEarlyWeights, bool, true);
inline bool early_weights(bool by_default) {
    return by_default ? !env_is("FTW_CUDA_EARLY_WEIGHTS", "0") : env_is("FTW_CUDA_EARLY_WEIGHTS", "1");
}

inline bool legacy_register_loop() { return env_is("FTW_CUDA_REGISTER_SHAPE", "legacy"); }

// kOptWide by the row's chunks, as measured on the H200 (T = 1, x the ceiling; docs/BENCHMARKS.md
// "Lean staged producer"): deepseek-v3's fp4 gate_up rows (28 chunks) gain with it (0.49 -> 0.51
// nvfp4), its down rows (8) and mxfp8's rows there (56, 16) neither gain nor lose, and every
// phase at the qwen3-30b-a3b size loses (fp4 rows of 8 and 3 chunks: 0.37 -> 0.30; mxfp8's
// gate_up, 16 chunks: 0.45 -> 0.38; not explained). So rows of FTW_CUDA_STAGED_WIDE chunks or
// more, 24 by default.
inline bool staged_wide(int nchunks) { return nchunks >= env_int("FTW_CUDA_STAGED_WIDE", 24); }

// kOptRows32 (32-row stages, a ring of 2, 128 registers), as measured on the H200 (T = 1, x the
// ceiling; docs/BENCHMARKS.md "32-row stages"): at the deepseek-v3 size both fp4 phases gain with
// it (nvfp4 0.51 -> 0.56, mxfp4 0.51 -> 0.55; T = 8 same experts 0.42 -> 0.52), at the
// qwen3-30b-a3b size both lose (0.38 -> 0.30; its gate_up rows have 8 chunks, as deepseek-v3's
// down rows, so the chunk count does not separate them). What does: the phase's 32-row items when
// every token picks the same experts, 7.8 and 13.6 per SM at deepseek-v3, 2.9 and 3.9 at qwen3.
// So by default: fp4 decoders (mxfp8 was not measured), at least 6 such items per SM.
// FTW_CUDA_STAGED_ROWS32=0: never; =n > 0: rows of at least n chunks, any decoder (benchmarks).
template <class Dec>
bool staged_rows32(const KernelParams& p, int PH, int nchunks) {
    const int n = env_int("FTW_CUDA_STAGED_ROWS32", -1);
    if (n >= 0) return n > 0 && nchunks >= n;
    if (Dec::VEC != 32) return false;
    const int bands = ((PH == 0 ? (p.I + 7) / 8 : (p.H + 15) / 16) + 1) / 2;  // of 32 rows
    return int64_t(bands) * std::min(p.K, p.num_experts) >= 6LL * device_sms();
}

// The staged kernel's variant for rows of 16-byte units (benchmarks time them in one run):
// FTW_CUDA_STAGED_OPT=0 runs the decoders' decode_v0 where they keep one, =1 the kernel before
// kOptLean and kOptActPerm, =lean / =perm one of the two, =wide all three at 128 registers in
// both phases; unset, kOptLean and kOptActPerm, and kOptWide where staged_wide says.
inline int staged_unit_opt() {
    const char* v = env_or("FTW_CUDA_STAGED_OPT", "");
    if (std::strcmp(v, "0") == 0) return 0;
    if (std::strcmp(v, "1") == 0) return kOptDecode;
    if (std::strcmp(v, "lean") == 0) return kOptDecode | kOptLean;
    if (std::strcmp(v, "perm") == 0) return kOptDecode | kOptActPerm;
    if (std::strcmp(v, "wide") == 0) return kStagedUnitOpt | kOptWide;
    return kStagedUnitOpt;
}

// The staged decode kernel's launch shape for items of `nck` chunks each (`fewest` items when
// every token picks the same experts, at most `most`): KS warps per block, the smallest of 1, 2,
// 4 that puts about 7 warps per SM to work at `fewest` items and gives no warp more than 16
// chunks of a row (or FTW_CUDA_STAGED_KSPLIT's, as far as the row has 2 chunks per warp); the
// grid is what fits on the GPU at once (occupancy, `fit` blocks per SM by KS), trimmed so that
// every block serves the same number of items (`per`).
struct StagedShape {
    int ks, cpw, per, grid;
};
// fine (kOptFine): the fewest warps (up to 4) that give each at most 2 chunks of an item instead.
template <class Kernel>
StagedShape staged_shape(Kernel kernel, int S, int units, int tiles, int nck, int fewest, int most, int (&fit)[5],
                         bool fine = false, int prefer = 0) {
    const int sms = device_sms();
    auto cap_of = [&](int ks) {  // blocks that fit on the GPU at once
        int n = 0;  // remembered only once the device answered
        if (fit[ks] == 0 &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 32 * ks, staged_smem(ks, S, units, tiles)) ==
                cudaSuccess)
            fit[ks] = n;
        return sms * std::max(fit[ks], 1);
    };
    auto shape = [&](int ks) {
        const int cap = std::min(most, cap_of(ks));
        const int per = (most + cap - 1) / cap;  // items per block
        return StagedShape{ks, (nck + ks - 1) / ks, per, (most + per - 1) / per};
    };
    int KS = 1;
    const int env_forced = forced_split("FTW_CUDA_STAGED_KSPLIT", 4);
    const int forced = env_forced ? env_forced : prefer;  // prefer: the decoder's kBlockWarps, or 1 (kOptLanes16)
    for (int ks = 1; ks <= 4; ks *= 2) {
        if (ks > 1 && nck < 2 * ks) break;  // at least 2 chunks per warp and item
        KS = ks;
        // and while each warp would still get 8 chunks of a row with twice as many (deepseek-v3
        // mxfp8: 0.55x -> 0.65x of the ceiling with 4 warps, qwen3 best with 2)
        if (forced ? ks >= forced
                   : fine ? nck <= 2 * ks : std::min(fewest, cap_of(ks)) * ks >= 7 * sms && nck < 16 * ks)
            break;
    }
    return shape(KS);
}

// The fewest chunks of a part of down's items for the parts rule below: S (a part fills the
// ring), or FTW_CUDA_STAGED_PART_MIN's (1..S; benchmarks: at the qwen3-30b-a3b size, fp4 down rows
// of 3 chunks, S = 4 refuses every split).
inline int staged_part_min(int S) {
    const int n = env_int("FTW_CUDA_STAGED_PART_MIN", 0);
    return n >= 1 && n <= S ? n : S;
}

// kOptFine for phase PH (rows of 16-byte units, 16-row stages: where kOptRows32 is not taken), as
// measured on the H200 (x the ceiling, T = 1 (T = 8 same experts); docs/BENCHMARKS.md "FP4Q"):
// mxfp8 at the qwen3-30b-a3b size gains with it in both phases, 0.45 -> 0.48 (0.39 -> 0.42), but
// not in either alone (gate_up only 0.42, down only 0.46); at the deepseek-v3 size it loses at
// T = 1 (0.68 -> 0.64); the fp4 decoders lose at the qwen3 size (nvfp4 0.37 -> 0.35, gate_up only
// 0.32, down only 0.37; at deepseek-v3 they stage 32 rows). The items per SM separate the sizes:
// gate_up's 16-row items when every token picks the same experts, 5.8 at qwen3, 15.5 at deepseek-v3.
// So by default: decoders of 16 values per unit (mxfp8), both phases where gate_up has fewer than
// 12 such items per SM. FTW_CUDA_STAGED_FINE=both|gate_up|down forces it (any decoder of 16-byte
// units), =off never (benchmarks, tests). Early weights on (FTW_CUDA_EARLY_WEIGHTS=1) keep the
// 4-stage ring they were measured with.
template <class Dec>
bool staged_fine(const KernelParams& p, int PH) {
    const char* v = env_or("FTW_CUDA_STAGED_FINE", "");
    if (*v != 0) return std::strcmp(v, "both") == 0 || std::strcmp(v, PH == 0 ? "gate_up" : "down") == 0;
    if (Dec::VEC != 16) return false;
    const int items = (p.I + 7) / 8 * std::min(p.K, p.num_experts);  // gate_up's 16-row bands x experts
    return items < 12LL * device_sms();
}

// Parts of a phase 1 item at T = 1 (down adds into out, so blocks can share an item's chunks):
// the count of 1, 2, 4 (each part at least staged_part_min chunks) whose shape gives each warp the fewest
// chunks in all, or FTW_CUDA_STAGED_PARTS's. Where the items do not divide into the blocks that
// fit, parts even out the blocks' work: deepseek-v3 down, 3584 items of 8 chunks for 2508
// blocks, 2 items per block; in 2 parts, 3 parts of 4 chunks (0.44x -> 0.46x of the ceiling;
// at T = 8 with 8 pairs per expert the doubled epilogue cost more: 0.38x -> 0.37x).
template <class Dec, int PH, int S, int OPT>
void launch_staged_opt(const KernelParams& p, cudaStream_t stream) {
    const auto kernel = experts_decode_staged<Dec, PH, S, OPT>;
    constexpr int tiles = (OPT & kOptRows32) != 0 ? 2 : 1;  // 16-row tiles per stage and item
    constexpr int units = StageShape<Dec>::kUnits * tiles;
    static int fit[5] = {};  // blocks per SM by KS (occupancy); 0: not asked yet
    // The ring of 4 warps plus the static routing table can pass the default 48 KB of shared
    // memory, also where the ring alone does not (gguf Q5_K: 45.5 KB + 2.6 KB failed to launch
    // with 4 warps on the H200): allow the largest launch below, once.
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_smem(4, S, units, tiles));
    (void)allowed;
    const int in = PH == 0 ? p.H : p.I;
    const int nchunks = (in / Dec::VEC + 7) / 8;
    const int nbands = ((PH == 0 ? (p.I + 7) / 8 : (p.H + 15) / 16) + tiles - 1) / tiles;
    const int fewest = nbands * std::min(p.K, p.num_experts);  // items when every token picks the same experts
    const int most = nbands * std::min(p.T * p.K, p.num_experts);
    // parts for the decoders of 16-byte units (measured there; gguf's byte streams keep the
    // shapes they were measured with, unless FTW_CUDA_STAGED_PARTS forces a count)
    constexpr bool units16 = !ByteStream<Dec>::value;
    int nparts = 1;
    constexpr bool fine = (OPT & kOptFine) != 0;
    // kOptLanes16 (gguf Q6_K, Q2_K at T = 1) in blocks of one warp, as measured on the H200
    // (docs/BENCHMARKS.md "A launch-shape sweep"; T = 1, x the ceiling): qwen3-30b-a3b Q6_K 0.36 ->
    // 0.39, Q2_K 0.31 -> 0.31; deepseek-v3 Q6_K 0.61 -> 0.62, Q2_K 0.39 -> 0.40 (Q4_K, Q5_K lost
    // with one warp at the qwen3 size: 0.38 -> 0.34, 0.36 -> 0.35)
    constexpr int prefer = (OPT & kOptLanes16) != 0 ? 1 : BlockWarps<Dec>::value;
    StagedShape sh = staged_shape(kernel, S, units, tiles, nchunks, fewest, most, fit, fine, prefer);
    int forced = forced_split("FTW_CUDA_STAGED_PARTS", 4);
    // gguf Q4_K, Q5_K, Q8_0 on sums (kSums32): down in 2 parts where it has fewer than 12 16-row
    // items per SM when every token picks the same experts (qwen3-30b-a3b: 1024 single-warp items
    // of 3 chunks become 2048 of 2 and 1), by measurement (H200, x the ceiling, T=1 / T=8 same
    // experts; docs/BENCHMARKS.md "KQ2"): qwen3-30b-a3b Q8_0 0.393 -> 0.417 / 0.344 -> 0.359, Q4_K
    // 0.360 -> 0.376 / 0.297 -> 0.307, Q5_K 0.335 -> 0.356 / 0.282 -> 0.298; at deepseek-v3 (27 per
    // SM; forced, with the one-column kernel) slower, 0.646 -> 0.630 for Q8_0 at T=1.
    // FTW_CUDA_STAGED_PARTS=1 keeps one part.
    if constexpr (ByteStream<Dec>::value && kSums32<Dec>)
        if (PH == 1 && !forced && int64_t(fewest) < 12LL * device_sms()) forced = 2;
    const int part_min = staged_part_min(S);
    if (PH == 1 && (forced > 1 || (units16 && !forced && p.T == 1))) {
        for (int n = 2; n <= (forced ? forced : 4); n *= 2) {
            const int nck = (nchunks + n - 1) / n;
            if (!forced && nck < part_min) break;
            const StagedShape t = staged_shape(kernel, S, units, tiles, nck, fewest * n, most * n, fit, fine, prefer);
            if (forced || int64_t(t.per) * t.cpw < int64_t(sh.per) * sh.cpw) sh = t, nparts = n;
        }
    }
    // phase 1 overlaps phase 0's tail; an int8 phase 0 (kOptInt8) the quantizing of x before it
    const bool programmatic =
        PH == 1 || (OPT & (kOptInt8 | kOptInt8Sums | kOptInt8Tokens)) != 0 ? programmatic_launch() : phase0_programmatic();
    launch_kernel(kernel, dim3(sh.grid), dim3(32 * sh.ks), staged_smem(sh.ks, S, units, tiles), stream, programmatic, p,
                  nbands, sh.cpw, nparts);
}

// The staged kernel of 16-byte-unit rows at OPT, with kOptScale2 for decoders with a decode_v1
// unless FTW_CUDA_STAGED_SCALE2=0 (benchmarks time both in one run; read at every launch).
template <class Dec, int PH, int S, int OPT>
void launch_staged_scale2(const KernelParams& p, cudaStream_t stream) {
    if constexpr (HasDecodeV1<Dec>::value)
        if (!env_is("FTW_CUDA_STAGED_SCALE2", "0")) return launch_staged_opt<Dec, PH, S, OPT | kOptScale2>(p, stream);
    launch_staged_opt<Dec, PH, S, OPT>(p, stream);
}

// kOptOneColumn (gguf Q4_K, Q5_K, Q8_0 on 32-value sub-block sums, rings of 2 stages) for phase PH,
// as measured on the H200 (x the ceiling; docs/BENCHMARKS.md "KQ2"): at the deepseek-v3 size, T=1,
// Q4_K 0.49 -> 0.51, Q5_K 0.52 -> 0.55, Q8_0 on sums 0.64 -> 0.65; T=8 same experts (the full body
// in the kernel that has both) Q8_0 0.55 -> 0.57, Q5_K 0.48 -> 0.49, Q4_K 0.47 -> 0.46; at the
// qwen3-30b-a3b size no gain (T=1 Q8_0 0.39 -> 0.38, Q4_K and Q5_K level; T=8 Q4_K 0.30 -> 0.29).
// What separates the sizes, as for staged_for_items (gguf): the phase's 16-row items when every
// token picks the same experts, 15.5 and 27 per SM at deepseek-v3, 5.8 and 7.8 at qwen3. So by
// default where there are at least 12 per SM; FTW_CUDA_STAGED_ONE=1 always, =0 never (read at
// every launch).
inline bool staged_one_column(const KernelParams& p, int PH) {
    const char* v = env_or("FTW_CUDA_STAGED_ONE", "");
    if (*v != 0) return std::strcmp(v, "0") != 0;
    const int64_t bands = PH == 0 ? (p.I + 7) / 8 : (p.H + 15) / 16;
    return bands * std::min(p.K, p.num_experts) >= 12LL * device_sms();
}

// The byte-stream (gguf) variant of the staged kernel: kOptCopy32 | kOptFull, or
// FTW_CUDA_STAGED_BYTES=0 the copies and per-unit checks as before them (benchmarks time both in
// one run; read at every launch).
constexpr int kByteStreamOpt = kStagedOptAll | kOptCopy32 | kOptFull;
inline int byte_stream_opt() { return env_is("FTW_CUDA_STAGED_BYTES", "0") ? kStagedOptAll : kByteStreamOpt; }

// kOptUnitCols at T = 1 where the decoder has it and chooses it (kUnitColsDefault), in the default
// variants (not with FTW_CUDA_STAGED_OPT, early weights or FTW_CUDA_STAGED_FINE forced, whose
// kernels keep the decode); FTW_CUDA_STAGED_UNITCOLS=0 never, =1 wherever the decoder has it
// (benchmarks, tests). Both phases of a step must decide alike (phase 0 stores act times
// 2^kUnitColsX for it), so nothing here depends on the phase.
FTW_OPTIONAL_MEMBER(UnitColsDefault, kUnitColsDefault, bool, true);
template <class Dec>
bool staged_unit_cols(const KernelParams& p) {
    if constexpr (!HasUnitCols<Dec>::value) {
        return false;
    } else {
        const char* fine = env_or("FTW_CUDA_STAGED_FINE", "");
        const bool on = env_is("FTW_CUDA_STAGED_UNITCOLS", "1") ||
                        (UnitColsDefault<Dec>::value && !env_is("FTW_CUDA_STAGED_UNITCOLS", "0"));
        return on && p.T == 1 && staged_unit_opt() == kStagedUnitOpt && !early_weights(false) &&
               (*fine == 0 || std::strcmp(fine, "off") == 0);
    }
}

template <class Dec, int PH, int S>
void launch_staged(const KernelParams& p, cudaStream_t stream) {
    if constexpr (ByteStream<Dec>::value) {
        if (byte_stream_opt() == kStagedOptAll) return launch_staged_opt<Dec, PH, S, kStagedOptAll>(p, stream);
        launch_staged_opt<Dec, PH, S, kByteStreamOpt>(p, stream);
    } else {
        // decoders that run here only when forced (bf16, fp8_block: FTW_CUDA_DECODE=staged) keep
        // the kernel they were measured with (and the build its size)
        if constexpr (!Staged<Dec>::preferred) {
            launch_staged_opt<Dec, PH, S, kStagedOptAll>(p, stream);
        } else {
            int opt = staged_unit_opt();
            const int nchunks = ((PH == 0 ? p.H : p.I) / Dec::VEC + 7) / 8;
            if (opt == kStagedUnitOpt && staged_wide(nchunks)) opt |= kOptWide;
            // a ring of 2 stages of 4 KB, at 128 registers (at 96, fp4's phases spill 88-96 bytes)
            if ((opt & ~kOptWide) == kStagedUnitOpt && staged_rows32<Dec>(p, PH, nchunks)) {
                if constexpr (HasUnitCols<Dec>::value)
                    if (staged_unit_cols<Dec>(p))
                        return launch_staged_opt<Dec, PH, 2, kStagedUnitOpt | kOptWide | kOptRows32 | kOptUnitCols>(
                            p, stream);
                return launch_staged_scale2<Dec, PH, 2, kStagedUnitOpt | kOptWide | kOptRows32>(p, stream);
            }
            if constexpr (HasUnitCols<Dec>::value) {  // (the rules below keep kOptFine and early weights from it)
                if ((opt == kStagedUnitOpt || opt == (kStagedUnitOpt | kOptWide)) && staged_unit_cols<Dec>(p)) {
                    if (opt & kOptWide) return launch_staged_opt<Dec, PH, S, kStagedUnitOpt | kOptWide | kOptUnitCols>(p, stream);
                    return launch_staged_opt<Dec, PH, S, kStagedUnitOpt | kOptUnitCols>(p, stream);
                }
            }
            // a ring of 2 stages of 2 KB, at 80 registers
            if (opt == kStagedUnitOpt && !early_weights(false) && staged_fine<Dec>(p, PH))
                return launch_staged_scale2<Dec, PH, 2, kStagedUnitOpt | kOptFine>(p, stream);
            if ((opt == kStagedUnitOpt || opt == (kStagedUnitOpt | kOptWide)) && early_weights(false)) opt |= kOptEarly;
            switch (opt) {
                case 0:  // (the same code as kOptDecode for decoders without decode_v0)
                    return launch_staged_opt<Dec, PH, S, HasDecodeV0<Dec>::value ? 0 : kOptDecode>(p, stream);
                case kOptDecode:
                    return launch_staged_opt<Dec, PH, S, kOptDecode>(p, stream);
                case kOptDecode | kOptLean:
                    return launch_staged_opt<Dec, PH, S, kOptDecode | kOptLean>(p, stream);
                case kOptDecode | kOptActPerm:
                    return launch_staged_opt<Dec, PH, S, kOptDecode | kOptActPerm>(p, stream);
                case kStagedUnitOpt | kOptWide:
                    return launch_staged_scale2<Dec, PH, S, kStagedUnitOpt | kOptWide>(p, stream);
                case kStagedUnitOpt | kOptEarly:
                    return launch_staged_opt<Dec, PH, S, kStagedUnitOpt | kOptEarly>(p, stream);
                case kStagedUnitOpt | kOptWide | kOptEarly:
                    return launch_staged_opt<Dec, PH, S, kStagedUnitOpt | kOptWide | kOptEarly>(p, stream);
                default:
                    return launch_staged_scale2<Dec, PH, S, kStagedUnitOpt>(p, stream);
            }
        }
    }
}

// The decode kernel of a phase: the decoder's default (kStaged), or FTW_CUDA_DECODE=classic /
// =staged for every decoder with the staged interface (benchmarks compare them in one run).
template <class Dec>
bool staged_decode() {
    if constexpr (!Staged<Dec>::available) {
        return false;
    } else {
        if (env_is("FTW_CUDA_DECODE", "classic")) return false;
        if (env_is("FTW_CUDA_DECODE", "staged")) return true;
        return Staged<Dec>::preferred;
    }
}

// The decoder the register-fed kernels (experts_decode, experts_proj) run: Dec, or Dec::Classic
// where a staged decoder names a twin for them (gguf: one instantiation of those kernels per
// type and way of loading, whether or not decode is staged).
template <class Dec>
struct ClassicOf {
    template <class D>
    static typename D::Classic test(int);
    template <class D>
    static D test(...);
    using type = decltype(test<Dec>(0));
};

// experts_decode's launch: a block row per distinct expert (every 8th), a block per NT 16-row
// tiles, k_split warps per block. EarlyOk: the kernel with early weights is built for C (the
// formats whose default decode this is), and runs where early_weights says.
template <class C, int PH, bool Legacy = RegisterShapeOf<C>::Legacy, bool EarlyOk = false>
void launch_register_fed(const KernelParams& p, cudaStream_t stream) {
    constexpr int NT = RegisterShapeOf<C>::NT;
    const int ny = std::min(p.T * p.K, 8);  // each block row serves every 8th distinct expert
    const int nx = PH == 0 ? (p.I + NT * 8 - 1) / (NT * 8) : (p.H + NT * 16 - 1) / (NT * 16);
    const int ks = k_split(PH == 0 ? p.H : p.I, C::VEC, nx * ny, device_sms());
    const bool programmatic =
        PH == 1 ? RegisterShapeOf<C>::Pdl && !Legacy && programmatic_launch() : phase0_programmatic();
    if constexpr (EarlyOk && !Legacy) {
        if (early_weights(EarlyWeightsDefault<C>::value))
            return launch_kernel(experts_decode<C, PH, NT, Legacy, true>, dim3(nx, ny), dim3(32 * ks), 0, stream,
                                 programmatic, p);
    }
    launch_kernel(experts_decode<C, PH, NT, Legacy>, dim3(nx, ny), dim3(32 * ks), 0, stream, programmatic, p);
}

// Both phases of a decode step with experts_decode.
template <class C, bool Legacy = RegisterShapeOf<C>::Legacy>
void launch_register_fed_step(const KernelParams& p, cudaStream_t stream) {
    launch_register_fed<C, 0, Legacy>(p, stream);
    check_launch("gate_up kernel");
    launch_register_fed<C, 1, Legacy>(p, stream);
    check_launch("down kernel");
}

// kOptLaneBlocks in the one-column kernel of the decoders that have it, as measured on the H200
// (x the ceiling, deepseek-v3 size, T = 1, the one-column body in the same run; docs/BENCHMARKS.md
// "K4"): call 1, a sub-block per lane's column, Q4_K 0.54 -> 0.56 (87.4 -> 83.5 us), Q5_K 0.56 ->
// 0.57 (101.5 -> 99.1 us), Q8_0 0.65 level (132.7 -> 132.6 us: its kLaneBlocksDefault is false);
// call 2, with kOptLaneCols (a lane's two sub-blocks in two columns), Q4_K 87.3 -> 79.5 us (0.54 ->
// 0.59; one column 83.3), Q5_K 101.2 -> 95.3 (0.56 -> 0.59; one column 99.8). So by default where
// the decoder chooses it, in two columns, at T = 1 only (every item one pair): at T = 8 same experts
// the kernel's full body, beside a lane-blocks body, ran slower in both calls (Q4_K 101 -> 115-116
// us, Q5_K 119 -> 137-142), so T > 1 keeps the kernel without them. FTW_CUDA_STAGED_LANES=2 in two
// columns, =1 in one, wherever the decoder has it (Q8_0 too) and at any T; =0 never (benchmarks,
// tests; read at every launch).
template <class Dec>
bool staged_lane_blocks(const KernelParams& p) {
    const char* v = env_or("FTW_CUDA_STAGED_LANES", "");
    if (*v != 0) return std::strcmp(v, "0") != 0;
    return LaneBlocksDefault<Dec>::value && p.T == 1;
}

// kOptLanes16 for the decoders that have it (gguf Q6_K, Q2_K), at 2 stages with whole copies, as
// measured on the H200 (x the ceiling, the full body in the same run; docs/BENCHMARKS.md "K6"):
// T = 1, deepseek-v3 Q6_K 114.5 -> 110.3 us (0.59 -> 0.61), Q2_K 87.2 -> 72.3 us (0.329 -> 0.397);
// qwen3-30b-a3b Q6_K 27.1 -> 26.6 us (0.36 -> 0.37), Q2_K 19.5 -> 17.9 us (0.28 -> 0.31). T = 8 same
// experts (every item of 8 pairs: the full body, in the kernel that also holds the lanes body) level
// or slower: Q6_K 135.0 -> 137.5 and 33.2 -> 33.6 us, Q2_K 90.1 -> 89.7 and 23.2 -> 24.4 us. So by
// default at T = 1 (every item one pair) at both sizes where the decoder chooses it
// (kLanes16Default), and T > 1 keeps the kernel without a lanes body (as for kOptLaneBlocks).
// FTW_CUDA_STAGED_LANES6=1 at any T (items of several pairs then take the full body of the same
// kernel), =0 never (benchmarks, tests; read at every launch).
template <class Dec>
bool staged_lanes16(const KernelParams& p) {
    const char* v = env_or("FTW_CUDA_STAGED_LANES6", "");
    if (*v != 0) return std::strcmp(v, "0") != 0;
    return Lanes16Default<Dec>::value && p.T == 1;
}

// The byte-stream staged kernel of `stages` stages (2, 3, or 4 for the decoders on float32 sums;
// false: none taken): kOptOneColumn where staged_one_column says, at 2 stages; kOptInt8 where the
// decoder's int8 says for the phase, at 2 stages, after quantize_int8; kOptByteCols where the
// decoder's byte_cols says, at 2 stages; kOptLanes16 where staged_lanes16 says; phase 0's
// kOptInt8Sums (Q4_K, Q5_K) where the decoder's int8 says, at 2 stages, after quantize_int8
// (rings of 3 or 4 stages measured slower: deepseek-v3 T = 1 up to 4% and 3-6%; docs/BENCHMARKS.md
// "I8K", commit 2043bc8 has the switch).
// x (phase 0) or act (phase 1) in integers for the int8 bodies (kOptInt8, kOptInt8Sums), launched
// just before the phase, which is its programmatic dependent
template <bool Interleaved, int PH>
void launch_quantize_int8(const KernelParams& p, cudaStream_t stream) {
    const int groups = PH == 0 ? p.H / 32 : p.K * (p.I / 32);
    launch_kernel(quantize_int8<Interleaved, PH>, dim3((groups + 3) / 4), dim3(128), 0, stream,
                  PH == 0 ? phase0_programmatic() : programmatic_launch(), p);
    check_launch("int8 x kernel");
}

// every token's x (phase 0) or pair's act (phase 1) in integers for kOptInt8Tokens, launched as
// launch_quantize_int8's
template <class Dec, int PH>
void launch_quantize_int8_tokens(const KernelParams& p, cudaStream_t stream) {
    const int nunits = (PH == 0 ? p.H : p.I) / 32, warps = (PH == 0 ? p.T : p.T * p.K) * ((nunits + 7) / 8);
    launch_kernel(quantize_int8_tokens<Dec, PH>, dim3((warps + 3) / 4), dim3(128), 0, stream,
                  PH == 0 ? phase0_programmatic() : programmatic_launch(), p);
    check_launch("int8 tokens x kernel");
}

template <class Dec, int PH, int OPT>
bool launch_byte_stream(const KernelParams& p, cudaStream_t stream, int stages) {
    if constexpr (Int8Tokens<Dec>::value && (OPT & kOptFull) != 0) {
        // T = 2..8 where the decoder's int8_tokens says (kOptInt8Tokens): x or act quantized first
        if (stages == 2 && Dec::int8_tokens(p, PH)) {
            launch_quantize_int8_tokens<Dec, PH>(p, stream);
            return launch_staged_opt<Dec, PH, 2, OPT | kOptInt8Tokens>(p, stream), true;
        }
    }
    if constexpr (Lanes16<Dec>::value && (OPT & kOptWholeCopy) != 0) {
        // at T = 1 where the decoder's int8 says (kOptInt8Sums on 16-value sub-blocks, Q2_K: both
        // phases): x (act) quantized first, the lanes16 kernel's launch with the int8 body
        if constexpr (Int8Sums<Dec>::value && (PH == 0 || Int8SumsDown<Dec>::value)) {
            if (stages == 2 && Dec::int8(p, PH)) {
                launch_quantize_int8<false, PH>(p, stream);
                return launch_staged_opt<Dec, PH, 2, OPT | kOptLanes16 | kOptInt8Sums>(p, stream), true;
            }
        }
        if (stages == 2 && staged_lanes16<Dec>(p)) return launch_staged_opt<Dec, PH, 2, OPT | kOptLanes16>(p, stream), true;
    }
    if constexpr (kSums32<Dec>) {
        // phase 0 at T = 1 where the decoder's int8 says (kOptInt8Sums, Q4_K / Q5_K): x quantized first
        if constexpr (Int8Sums<Dec>::value && LaneBlocks<Dec>::value && PH == 0 && (OPT & kOptWholeCopy) != 0) {
            if (stages == 2 && Dec::int8(p, PH)) {
                launch_quantize_int8<false, 0>(p, stream);
                return launch_staged_opt<Dec, PH, 2, OPT | kOptOneColumn | kOptLaneBlocks | kOptInt8Sums>(p, stream), true;
            }
        }
        if (stages == 2 && staged_one_column(p, PH)) {
            if constexpr (LaneBlocks<Dec>::value && (OPT & kOptWholeCopy) != 0)
                if (staged_lane_blocks<Dec>(p)) {  // in two columns per lane but with =1
                    if (env_is("FTW_CUDA_STAGED_LANES", "1"))
                        return launch_staged_opt<Dec, PH, 2, OPT | kOptOneColumn | kOptLaneBlocks>(p, stream), true;
                    return launch_staged_opt<Dec, PH, 2, OPT | kOptOneColumn | kOptLaneBlocks | kOptLaneCols>(p, stream), true;
                }
            return launch_staged_opt<Dec, PH, 2, OPT | kOptOneColumn>(p, stream), true;
        }
    }
    if constexpr (Int8Cols<Dec>::value) {  // T = 1 where the decoder says (kOptInt8): x or act quantized first
        if (stages == 2 && Dec::int8(p, PH)) {
            launch_quantize_int8<Int8Interleaved<Dec>::value, PH>(p, stream);
            return launch_staged_opt<Dec, PH, 2, OPT | kOptInt8>(p, stream), true;
        }
    }
    if constexpr (ByteCols<Dec>::value) {  // T = 1 where the decoder says (kOptByteCols)
        if (stages == 2 && Dec::byte_cols(p)) return launch_staged_opt<Dec, PH, 2, OPT | kOptByteCols>(p, stream), true;
    }
    if (stages == 3) return launch_staged_opt<Dec, PH, 3, OPT>(p, stream), true;
    if (stages == 2) return launch_staged_opt<Dec, PH, 2, OPT>(p, stream), true;
    if constexpr (SubBlocks<Dec>::value || IntSums<Dec>::value) return launch_staged_opt<Dec, PH, 4, OPT>(p, stream), true;
    return false;
}
// kOptWholeCopy for the decoders on float32 sums unless FTW_CUDA_STAGED_WHOLECOPY=0 (benchmarks,
// tests; read at every launch). Measured faster (H200, docs/BENCHMARKS.md "Q3": deepseek-v3 T=1
// Q3_K 0.39x -> 0.41x of the ceiling, Q2_K 0.31x -> 0.33x)
inline bool staged_whole_copy() { return !env_is("FTW_CUDA_STAGED_WHOLECOPY", "0"); }

// One decode phase (T <= 8): experts_decode_staged where the decoder chooses it, else
// experts_decode (with ClassicOf<Dec>). Each phase chooses for itself (gguf's gate_up and down
// decoders may differ); phase 0 of either kernel clears out, phase 1 of either waits for all of
// phase 0 (its programmatic launch starts early only after a staged phase 0's trigger).
template <class Dec, int PH>
void launch_decode(const KernelParams& p, cudaStream_t stream) {
    if (decode_phase_skipped(PH)) return;
    if constexpr (Int8Only<Dec>::value) {  // (launched only where the phase takes int8 units: no other staged kernel made)
        if (staged_decode<Dec>()) {
            launch_quantize_int8<Int8Interleaved<Dec>::value, PH>(p, stream);
            return launch_staged_opt<Dec, PH, 2, kByteStreamOpt | kOptInt8>(p, stream);
        }
    } else if constexpr (Staged<Dec>::available) {
        if (staged_decode<Dec>()) {
            // (ShortRing: a byte-stream decoder asking for the short rings of the wide ones)
            constexpr bool wide = StageShape<Dec>::kPitch >= 13 || ShortRing<Dec>::value;
            constexpr bool sums = SubBlocks<Dec>::value || IntSums<Dec>::value;  // float32 sub-block sums
            if constexpr (ByteStream<Dec>::value && (wide || sums)) {
                // wide byte-stream chunks (gguf Q6_K: 15 pieces per row, Q8_0: 19): 4 stages of
                // 16 rows take 15-19 KB of ring per warp, so shared memory, not registers, bounds
                // the warps per SM (Q8_0: 7.6 warps per SM at 4 stages, ncu). 2 stages, by
                // measurement (H200, T=1, x the ceiling: deepseek-v3 Q8_0 0.42 -> 0.63, Q6_K 0.33
                // -> 0.49; qwen3-30b-a3b 0.25 -> 0.37, 0.28 -> 0.32; 3 stages in between);
                // FTW_CUDA_STAGED_STAGES=3|4 runs more, FTW_CUDA_STAGED_BYTES=0 the byte-stream
                // path as it was, 4 stages included (benchmarks, tests). The sub-block decoders
                // (kSubBlocks: gguf Q2_K, Q3_K, Q4_K, Q5_K, whose rings of 16 rows of 6-11 pieces
                // are not wide, and Q6_K)
                // run their copies one way only, 2 stages too by measurement (H200, T=1, x the
                // ceiling against 4 stages: deepseek-v3 Q4_K 0.47 -> 0.50, Q5_K 0.47 -> 0.53;
                // qwen3-30b-a3b 0.30 -> 0.36, 0.33 -> 0.34; 3 stages in between); the IQ types on
                // sums (kIntSums) take 2 as well (3 stages: no faster, IQ2_XS 0.19 -> 0.17 at deepseek-v3).
                // gguf Q4_0, IQ4_NL, MXFP4 (pitch 11), IQ4_XS (9) take 2 too (kShortRing: at 4 stages
                // their staged kernels spill 24-60 bytes, at 2 none; deepseek-v3 Q4_0 staged 0.42 at 4
                // stages in an earlier run, 0.54 at 2)
                const int n = env_int("FTW_CUDA_STAGED_STAGES", 0);
                const int stages = n >= 2 && n <= 4 ? n : 2;
                if (sums || byte_stream_opt() == kByteStreamOpt) {
                    if constexpr (sums) {
                        if (staged_whole_copy()) {
                            launch_byte_stream<Dec, PH, kByteStreamOpt | kOptWholeCopy>(p, stream, stages);
                            return;
                        }
                    }
                    if (launch_byte_stream<Dec, PH, kByteStreamOpt>(p, stream, stages)) return;
                }
            }
            if constexpr (!sums) launch_staged<Dec, PH, 4>(p, stream);  // 4 stages: 8 KB of ring per warp (16-byte units)
            return;
        }
    }
    // early weights for the decoders that chose this kernel over the staged one (kStaged false:
    // bf16, fp8_block), not for the register-fed twins and types of gguf (a build of every type)
    using C = typename ClassicOf<Dec>::type;
    launch_register_fed<C, PH, RegisterShapeOf<C>::Legacy, Staged<Dec>::available && !Staged<Dec>::preferred>(p, stream);
}

// Prefill's tiles (experts_proj): MT m-tiles of 16 pairs of one expert, NT 8-row n-tiles per
// warp, RG warps per block (4 warps each own 16 rows and reuse every decoded weight across the
// 64 pairs).
constexpr int kProjMT = 4, kProjNT = 2, kProjRG = 4;

// Decode (T <= 8, T * K <= 128): blocks find their expert themselves. Prefill: the routing kernel
// first makes tiles of 64 pairs of one expert (begin_step).
inline bool decode_step(const KernelParams& p) { return p.T * p.K <= kDecodeMaxPairs && p.T <= 8; }

inline void begin_step(const KernelParams& p, cudaStream_t stream) {
    if (!decode_step(p)) launch_route(p, 16 * kProjMT, stream);
}

// One phase of a layer-step, after begin_step: 0 = gate_up + activation, 1 = down + weighted sum.
// A projection's decoder is chosen on its own (gguf's gate_up and down types differ), so a
// format with one decoder per type can compile each type's phases in a translation unit of its
// own (csrc/formats/gguf/build.cmake).
template <class Dec, int PH>
void launch_phase(const KernelParams& p, cudaStream_t stream) {
    if (decode_step(p)) {
        launch_decode<Dec, PH>(p, stream);
    } else {
        using C = typename ClassicOf<Dec>::type;
        const int tiles = max_tiles(p.T * p.K, 16 * kProjMT, p.num_experts);
        const int rows = PH == 0 ? kProjRG * kProjNT * 4 : kProjRG * kProjNT * 8;  // per block
        const dim3 grid(((PH == 0 ? p.I : p.H) + rows - 1) / rows, tiles);
        experts_proj<C, PH, kProjMT, kProjNT, kProjRG><<<grid, 32 * kProjRG, 0, stream>>>(p);
    }
    check_launch(PH == 0 ? "gate_up kernel" : "down kernel");
}

// A layer-step: two launches (decode), or the routing kernel and two launches (prefill).
// DecDown: down's decoder where it differs from gate_up's.
template <class Dec, class DecDown = Dec>
void launch_experts(const KernelParams& p, cudaStream_t stream) {
    begin_step(p, stream);
    launch_phase<Dec, 0>(p, stream);
    launch_phase<DecDown, 1>(p, stream);
}

// A format whose decoder is a template over its RegisterShape (DecT<Shape>): the first shape is
// its default; FTW_CUDA_REGISTER_SHAPE=i (1, 2, ...) decodes with the i-th of the others and
// =legacy with RegisterShape<> in the legacy loop, the decode every decoder had before shapes
// (benchmarks compare them in one run). FTW_CUDA_DECODE=staged takes the default's decoder,
// prefill RegisterShape<>'s (the shape only sets its loads' L2 prefetch size).
template <template <class> class DecT, class Shape, class... Others>
void launch_shaped(const KernelParams& p, cudaStream_t stream) {
    if (!decode_step(p)) return launch_experts<DecT<RegisterShape<>>>(p, stream);  // prefill's loads as before the shapes
    if (legacy_register_loop()) return launch_register_fed_step<DecT<RegisterShape<>>, true>(p, stream);
    const int i = env_int("FTW_CUDA_REGISTER_SHAPE", 0);
    int k = 0;
    bool done = false;
    auto other = [&](auto shape) {
        if (!done && ++k == i) launch_register_fed_step<DecT<decltype(shape)>>(p, stream), done = true;
    };
    (other(Others{}), ...);
    if (!done) launch_experts<DecT<Shape>>(p, stream);
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

// In csrc/formats/<name>/cuda.cu: FTW_CUDA_FORMAT(nvfp4, Nvfp4Decoder, needs_fn, gu_bias, d_bias, fp8opts),
// or FTW_CUDA_FORMAT_LAUNCH with the format's own launch function (launch_shaped).
#define FTW_CUDA_FORMAT_LAUNCH(NAME, VEC, LAUNCH, NEEDS, GU_BIAS, D_BIAS, FP8OPTS)                    \
    static const ::ftw::cuda::CudaFormat ftw_cuda_format_##NAME = {#NAME,   VEC,    NEEDS, LAUNCH,    \
                                                                   GU_BIAS, D_BIAS, FP8OPTS};       \
    static const ::ftw::cuda::CudaFormatRegistrar ftw_cuda_registrar_##NAME(&ftw_cuda_format_##NAME)
#define FTW_CUDA_FORMAT(NAME, DEC, NEEDS, GU_BIAS, D_BIAS, FP8OPTS) \
    FTW_CUDA_FORMAT_LAUNCH(NAME, DEC::VEC, &::ftw::cuda::launch_experts<DEC>, NEEDS, GU_BIAS, D_BIAS, FP8OPTS)
