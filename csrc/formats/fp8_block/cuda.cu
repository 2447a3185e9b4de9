// Block FP8 experts on the GPU: e4m3 weights, one float32 (or bf16) scale per [bo, bi] block.
// Each 16-byte unit (16 values) lies in one input block (bi is a multiple of 16, or covers the
// row), so the lane loads one scale per unit and forms e4m3 * scale in float32, rounded once
// to bf16 (relative error <= 2^-9 per weight; the scale is not a power of two).
#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {
namespace {

int cdiv(int a, int b) { return (a + b - 1) / b; }

struct Fp8BlockDecoder {
    static constexpr int VEC = 16;
    struct Row {
        const uint4* w;
        const uint8_t* s;  // this row's scale row
        int bi, f32;
    };
    struct Raw {
        uint4 w;
        float s;
    };
    __device__ static Row row(const KernelParams& p, int proj, int slot, int r) {
        const int in = proj == 0 ? p.H : p.I;
        const int bo = p.block_out, bi = p.block_in;
        // fused gate_up scales: gate's blocks, then up's (DESIGN.md), right when I % bo != 0
        const int rb = proj == 1 ? r / bo : (r < p.I ? r / bo : (p.I + bo - 1) / bo + (r - p.I) / bo);
        const int cols = (in + bi - 1) / bi;
        const uint8_t* s = bank_row(p, 2 + proj, slot) + int64_t(rb) * cols * (p.scale_f32 ? 4 : 2);
        return {reinterpret_cast<const uint4*>(bank_row(p, proj, slot) + int64_t(r) * in), s, bi, p.scale_f32};
    }
    __device__ static Raw load(const Row& row, int u) {
        const int kb = u * 16 / row.bi;
        const float s = row.f32 ? __ldg(reinterpret_cast<const float*>(row.s) + kb)
                                : bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(row.s) + kb));
        return {ld_stream(row.w + u), s};
    }
    __device__ static void decode(const Raw& raw, uint32_t (&w)[8]) {
        const float m = raw.s * 2.8823037615171174e17f;  // * 2^58: w carries 2^-62 (with e4m3's 2^-120)
        const uint32_t q[4] = {raw.w.x, raw.w.y, raw.w.z, raw.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            e4m3x4_raw(q[i], lo, hi);
            w[2 * i] = pack_bf16x2(__uint_as_float(lo << 16) * m, __uint_as_float(lo & 0xFFFF0000u) * m);
            w[2 * i + 1] = pack_bf16x2(__uint_as_float(hi << 16) * m, __uint_as_float(hi & 0xFFFF0000u) * m);
        }
    }
    __device__ static void permute(const uint32_t (&x)[8], uint32_t (&a)[8]) { permute_fp8(x, a); }
    __device__ static float post(const KernelParams&, int, int, int) { return kTwo62; }
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
