// Block FP8 experts on the GPU: e4m3 weights, one float32 (or bf16) scale per [bo, bi] block.
// e4m3 values are exact in bf16, so the decoder only moves bits; the block scale multiplies each
// 64-value chunk's partial sums in float32 (kChunkScale: a chunk is 4 lanes x 16 bytes and lies
// in one input block, bi being a multiple of 64 or covering the row), so no weight is rounded.
// Decode runs the register-fed kernel with two 16-row tiles per warp (RegisterShape below: one
// x load, permute and scale lookup serve both; the e4m3 decode is most of the work per byte).
#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {
namespace {

int cdiv(int a, int b) { return (a + b - 1) / b; }

// Block128: float32 scales of 128 x 128 blocks (every checkpoint seen): a chunk's scale is one
// load at c / 2, and the 16-row tiles of a block share it (kScaleRows); otherwise any block
// size of the host's check and float32 or bf16 scales.
template <class Shape, bool Block128>
struct Fp8BlockDecoder {
    using RegisterShape = Shape;
    static constexpr int VEC = 16;
    static constexpr bool kChunkScale = true;
    static constexpr int kScaleRows = Block128 ? 128 : 1;  // rows (aligned groups) sharing one scale row
    struct Row { const uint4* w; };
    struct Raw { uint4 w; };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int in = proj == 0 ? p.H : p.I;
        return {reinterpret_cast<const uint4*>(bank_row(p, proj, slot) + int64_t(r) * in)};
    }
    __device__ static Raw load(const Row& row, int u) { return {ld_stream<Shape::L2Bytes>(row.w + u)}; }
    // experts_decode_staged runs fp8_block but is not its default: measured slower at T=1 (H200,
    // deepseek-v3 size: 0.40x the ceiling against experts_decode's 0.47x; docs/BENCHMARKS.md)
    static constexpr bool kStaged = false;
    struct Side {};
    __device__ static const uint8_t* weights(const KernelParams& p, int proj, int slot) { return bank_row(p, proj, slot); }
    __device__ static int64_t weight_row_bytes(const KernelParams& p, int proj) {
        const int in = proj == 0 ? p.H : p.I;
        return int64_t(in);
    }
    __device__ static Side side(const Row&, int) { return {}; }
    __device__ static Raw raw(const uint4& w, const Side&) { return {w}; }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[8]) {
        constexpr uint32_t two120 = 0x7B807B80u;  // bf16x2 (2^120, 2^120): e4m3 * 2^-120 -> the value
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            e4m3x4_raw(q[i], lo, hi);
            w[2 * i] = hmul2(lo, two120);
            w[2 * i + 1] = hmul2(hi, two120);
        }
    }
    __device__ static void permute(const uint32_t (&x)[8], uint32_t (&a)[8]) { permute_fp8(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return 1.0f; }
    // Row r's block scales (its row block's, gate's blocks then up's for the fused gate_up:
    // DESIGN.md; right when I % bo != 0), found once per row with how a chunk finds its input
    // block: a shift for power-of-two block sizes (128 in every checkpoint), kept with the row so
    // that the per-chunk lookup is a shift and a load; an integer division otherwise (sh < 0).
    struct ChunkRow {
        const uint8_t* s;
        int sh;
    };
    __device__ static ChunkRow chunk_row(const KernelParams& p, int proj, int slot, int r) {
        if constexpr (Block128) {
            const int in = proj == 0 ? p.H : p.I;
            const int rb = proj == 1 || r < p.I ? r >> 7 : ((p.I + 127) >> 7) + ((r - p.I) >> 7);
            return {bank_row(p, 2 + proj, slot) + int64_t(rb) * ((in + 127) >> 7) * 4, 1};
        }
        const int in = proj == 0 ? p.H : p.I;
        const int bo = p.block_out, bi = p.block_in;
        int rb, nbi;
        if (((bo & (bo - 1)) | (bi & (bi - 1))) == 0) {
            const int so = __ffs(bo) - 1, si = __ffs(bi) - 1;
            rb = proj == 1 || r < p.I ? r >> so : ((p.I + bo - 1) >> so) + ((r - p.I) >> so);
            nbi = (in + bi - 1) >> si;
        } else {
            rb = proj == 1 || r < p.I ? r / bo : (p.I + bo - 1) / bo + (r - p.I) / bo;
            nbi = (in + bi - 1) / bi;
        }
        // bi < 64 only when one block covers the row (checked on the host): every chunk in block 0
        const int sh = (bi & (bi - 1)) == 0 ? max(__ffs(bi) - 1 - 6, 0) : -1;
        return {bank_row(p, 2 + proj, slot) + int64_t(rb) * nbi * (p.scale_f32 ? 4 : 2), bi < 64 ? 30 : sh};
    }
    // the scale of input chunk c (values 64c .. 64c + 63: one input block, checked on the host)
    __device__ static float chunk_scale(const KernelParams& p, int, const ChunkRow& s, int c) {
        if constexpr (Block128) return __ldg(reinterpret_cast<const float*>(s.s) + (c >> 1));
        const int b = s.sh >= 0 ? c >> s.sh : (c << 6) / p.block_in;
        return p.scale_f32 ? __ldg(reinterpret_cast<const float*>(s.s) + b)
                           : bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(s.s) + b));
    }
};

// banks: gate_up [2I, H] e4m3, down [H, I] e4m3, gate_up_scale [2 cdiv(I,bo), cdiv(H,bi)],
// down_scale [cdiv(H,bo), cdiv(I,bi)]
int needs(int H, int I, const KernelParams& p, BankNeed* out) {
    const int bo = p.block_out, bi = p.block_in, s = p.scale_f32 ? 4 : 2;
    out[0] = {0, "gate_up", int64_t(2) * I * H, 16, false};
    out[1] = {1, "down", int64_t(H) * I, 16, false};
    out[2] = {2, "gate_up_scale", int64_t(2) * cdiv(I, bo) * cdiv(H, bi) * s, s, false};
    out[3] = {3, "down_scale", int64_t(cdiv(H, bo)) * cdiv(I, bi) * s, s, false};
    return 4;
}

template <class Shape>
using Fp8Block128 = Fp8BlockDecoder<Shape, true>;
template <class Shape>
using Fp8BlockAny = Fp8BlockDecoder<Shape, false>;

// FTW_CUDA_FP8_SCALES=any: the general scale lookup for 128 x 128 float32 blocks too (benchmarks)
bool block128(const KernelParams& p) {
    if (env_is("FTW_CUDA_FP8_SCALES", "any")) return false;
    return p.scale_f32 && p.block_out == 128 && p.block_in == 128;
}

// RegisterShape<NT, D, XRing, MaxRegs, ScaleRing, L2Bytes, Pdl>
using Fp8Shape = RegisterShape<2, 2, false, 128, true, 256, true>;

void launch(const KernelParams& p, cudaStream_t stream) {
    if (block128(p)) {
        launch_shaped<Fp8Block128, Fp8Shape,  // the default, then the shapes benchmarks compare (rs<i>)
                      RegisterShape<2, 2, false, 128, true, 0, true>,     // 1: no L2 prefetch size
                      RegisterShape<2, 2, false, 128, true, 256, false>,  // 2: phase 1 launched after phase 0
                      RegisterShape<2, 3, false, 128, true, 256, true>,   // 3: 3 chunks in flight
                      RegisterShape<1, 3, true, 128, false, 0, false>>(p, stream);  // 4: main's before (one tile)
    } else {
        launch_shaped<Fp8BlockAny, Fp8Shape>(p, stream);
    }
}

}  // namespace

FTW_CUDA_FORMAT_LAUNCH(fp8_block, 16, &launch, needs, -1, -1, true);

}  // namespace ftw::cuda
