// DeepSeek-V4 FP4 experts on the GPU: the E8M0-scaled FP4 decoder, no biases. The hidden states
// enter as bf16; DeepSeek-V4's own path also rounds activations to e4m3 per act_block, which
// this kernel does not model (the reference decoder does not either).
#include "cuda/e8m0_fp4_decoder.cuh"

namespace ftw::cuda {
namespace {

int needs(int H, int I, const KernelParams&, BankNeed* out) { return e8m0_fp4_needs(H, I, out); }

}  // namespace

FTW_CUDA_FORMAT_LAUNCH(ds_fp4, E8m0Fp4Decoder::VEC, &launch_e8m0_fp4, needs, -1, -1, false);

}  // namespace ftw::cuda
