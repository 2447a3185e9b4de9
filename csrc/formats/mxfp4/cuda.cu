// MXFP4 (gpt-oss) experts on the GPU: the E8M0-scaled FP4 decoder plus the expert biases
// (gate_up_bias [2I], down_bias [H], bf16), which gpt-oss always has.
#include "cuda/e8m0_fp4_decoder.cuh"

namespace ftw::cuda {
namespace {

int needs(int H, int I, const KernelParams& p, BankNeed* out) {
    const int n = e8m0_fp4_needs(H, I, out);
    const int b = p.bias_f32 ? 4 : 2;
    out[n] = {4, "gate_up_bias", int64_t(2) * I * b, b, false};
    out[n + 1] = {5, "down_bias", int64_t(H) * b, b, false};
    return n + 2;
}

}  // namespace

FTW_CUDA_FORMAT_LAUNCH(mxfp4, E8m0Fp4Decoder::VEC, &launch_e8m0_fp4, needs, 4, 5, false);

}  // namespace ftw::cuda
