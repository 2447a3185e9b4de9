// DeepSeek-V4 FP4 experts: mxfp4's bytes without biases. With the executor's act_quant option,
// the inputs of both projections are quantized to e4m3 in blocks of act_block values first,
// as DeepSeek-V4's GPU path does (docs/ARCHITECTURE.md, "e4m3 activation quantization"):
//   amax = max(max |x| over the block, 1e-4); s = amax / 448;
//   scale_fmt "ue8m0": s = 2^ceil(log2 s) (a power of two);  "float" (or absent): s as is;
//   x <- e4m3(x / s) * s   (round to nearest even, float32 arithmetic).
#include <algorithm>
#include <cmath>

#include "core/decoders.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

class DsFp4 : public ChunkedFormat<Fp4E8m0Decoder> {
public:
    DsFp4(bool act_quant, int64_t act_block, bool ue8m0)
        : ChunkedFormat(Fp4E8m0Decoder{}), act_quant_(act_quant), act_block_(act_block), ue8m0_(ue8m0) {}

    bool transforms_inputs() const override { return act_quant_; }

    void transform_inputs(float* X, int64_t ldx, int64_t ntok, int64_t K) const override {
        for (int64_t t = 0; t < ntok; ++t) {
            float* x = X + t * ldx;
            for (int64_t b0 = 0; b0 < K; b0 += act_block_) {
                const int64_t b1 = std::min(K, b0 + act_block_);
                float amax = 1e-4f;
                for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
                float s = amax / 448.0f;
                if (ue8m0_) s = std::exp2(std::ceil(std::log2(s)));
                for (int64_t i = b0; i < b1; ++i) x[i] = num::round_to_e4m3(x[i] / s) * s;
            }
        }
    }

private:
    bool act_quant_;
    int64_t act_block_;
    bool ue8m0_;
};

std::unique_ptr<Format> make(const Options& o) {
    const std::string mode = option_str(o, "act_quant", "");
    if (!mode.empty() && mode != "e4m3") throw UnsupportedError("ds_fp4: act_quant '" + mode + "' is not e4m3");
    const int64_t block = option_int(o, "act_block", 128);
    if (block <= 0) throw FormatError("ds_fp4: act_block must be positive");
    const std::string fmt = option_str(o, "scale_fmt", "float");
    if (fmt != "ue8m0" && fmt != "float") throw FormatError("ds_fp4: scale_fmt must be ue8m0 or float, got '" + fmt + "'");
    return std::make_unique<DsFp4>(!mode.empty(), block, fmt == "ue8m0");
}

}  // namespace

extern const FormatInfo kDsFp4 = {"ds_fp4", make};
FTW_CPU_FORMAT(kDsFp4);

}  // namespace ftw::cpu
