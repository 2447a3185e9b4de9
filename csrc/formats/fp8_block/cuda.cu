// Block FP8 experts on the GPU: e4m3 weights, one float32 (or bf16) scale per [bo, bi] block.
// e4m3 values are exact in bf16, so the decoder only moves bits; the block scale multiplies each
// 64-value chunk's partial sums in float32 (kChunkScale: a chunk is 4 lanes x 16 bytes and lies
// in one input block, bi being a multiple of 64 or covering the row), so no weight is rounded.
#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {
namespace {

int cdiv(int a, int b) { return (a + b - 1) / b; }

struct Fp8BlockDecoder {
    static constexpr int VEC = 16;
    static constexpr bool kChunkScale = true;
    struct Row { const uint4* w; };
    struct Raw { uint4 w; };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int in = proj == 0 ? p.H : p.I;
        return {reinterpret_cast<const uint4*>(bank_row(p, proj, slot) + int64_t(r) * in)};
    }
    __device__ static Raw load(const Row& row, int u) { return {ld_stream(row.w + u)}; }
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
        constexpr uint32_t two64 = 0x5F805F80u;  // bf16x2 (2^64, 2^64): e4m3 * 2^-120 -> * 2^-56, all normal
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            e4m3x4_raw(q[i], lo, hi);
            w[2 * i] = hmul2(lo, two64);
            w[2 * i + 1] = hmul2(hi, two64);
        }
    }
    __device__ static void permute(const uint32_t (&x)[8], uint32_t (&a)[8]) { permute_fp8(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return 7.205759403792794e16f; }  // 2^56
    // the block scale of row r for input chunk c (values 64c .. 64c + 63)
    __device__ static float chunk_scale(const KernelParams& p, int proj, int slot, int r, int c) {
        const int in = proj == 0 ? p.H : p.I;
        const int bo = p.block_out, bi = p.block_in;
        // fused gate_up scales: gate's blocks, then up's (DESIGN.md), right when I % bo != 0
        int64_t at;
        if (((bo & (bo - 1)) | (bi & (bi - 1))) == 0) {  // powers of two (128 in every checkpoint): shifts
            const int so = __ffs(bo) - 1, si = __ffs(bi) - 1;
            const int rb = proj == 1 || r < p.I ? r >> so : ((p.I + bo - 1) >> so) + ((r - p.I) >> so);
            at = int64_t(rb) * ((in + bi - 1) >> si) + ((c * 64) >> si);
        } else {  // an integer division is ~20 instructions: per chunk and row, it showed in the profile
            const int rb = proj == 1 ? r / bo : (r < p.I ? r / bo : (p.I + bo - 1) / bo + (r - p.I) / bo);
            at = int64_t(rb) * ((in + bi - 1) / bi) + (c * 64) / bi;
        }
        const uint8_t* s = bank_row(p, 2 + proj, slot);
        return p.scale_f32 ? __ldg(reinterpret_cast<const float*>(s) + at)
                           : bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(s) + at));
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

}  // namespace

FTW_CUDA_FORMAT(fp8_block, Fp8BlockDecoder, needs, -1, -1, true);

}  // namespace ftw::cuda
