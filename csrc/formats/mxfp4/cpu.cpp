// gpt-oss MXFP4 experts: e2m1 pairs with an E8M0 scale per 32 values, bf16 biases (required).
#include "core/decoders.h"
#include "core/format_registry.h"

namespace ftw::cpu {
namespace {

struct Mxfp4Decoder : Fp4E8m0Decoder {
    std::vector<BankNeed> needs(int64_t H, int64_t I) const {
        auto n = fp4_needs(H, I);
        n.push_back({"gate_up_bias", {DType::BF16}, 2 * I});
        n.push_back({"down_bias", {DType::BF16}, H});
        return n;
    }
};

}  // namespace

extern const FormatInfo kMxfp4 = {
    "mxfp4", [](const Options&) -> std::unique_ptr<Format> { return std::make_unique<ChunkedFormat<Mxfp4Decoder>>(Mxfp4Decoder{}); }};
FTW_CPU_FORMAT(kMxfp4);

}  // namespace ftw::cpu
