// ftw._runtime bindings of the CUDA experts (csrc/cuda/experts.h). Device pointers and the stream
// cross as integers (torch's data_ptr() / cuda_stream on the Python side: ftw/runtime/cuda_experts.py),
// so no torch or CUDA header is needed here. In a build without CUDA the same names exist and
// refuse with UnsupportedError, so callers need one code path.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/registry.h"
#include "core/errors.h"
#ifdef FTW_WITH_CUDA
#include "cuda/experts.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

#ifdef FTW_WITH_CUDA
ftw::cuda::ActKind act_kind(const std::string& kind) {
    if (kind == "silu") return ftw::cuda::ActKind::Silu;
    if (kind == "swiglu_oai") return ftw::cuda::ActKind::SwigluOai;
    throw ftw::UnsupportedError("cuda experts: activation '" + kind + "' has no CUDA kernel (silu, swiglu_oai)");
}
#endif

// the names a CUDA build lists (formats, ggml types); none without CUDA
#ifdef FTW_WITH_CUDA
#define FTW_CUDA_NAMES(call) (call)
#else
#define FTW_CUDA_NAMES(call) std::vector<std::string>{}
#endif

[[noreturn, maybe_unused]] void no_cuda() { throw ftw::UnsupportedError("this ftw._runtime was built without CUDA (no nvcc at build time)"); }

}  // namespace

FTW_BINDINGS(cuda_experts) {
    m.def(
        "cuda_experts_formats",
        []() -> std::vector<std::string> { return FTW_CUDA_NAMES(ftw::cuda::experts_formats()); },
        "Layer formats with a CUDA expert kernel in this build (empty without CUDA).");

    m.def(
        "cuda_ggml_types",
        []() -> std::vector<std::string> { return FTW_CUDA_NAMES(ftw::cuda::ggml_cuda_types()); },
        "ggml types the gguf format decodes on the GPU in this build (empty without CUDA).");

    m.def(
        "cuda_ggml_own_decoders",
        []() -> std::vector<std::string> { return FTW_CUDA_NAMES(ftw::cuda::ggml_cuda_own_decoders()); },
        "Of cuda_ggml_types, those with kernels of their own in this build (the others run the "
        "table-driven decoder).");

    m.def(
        "cuda_experts_workspace_bytes",
        [](int T, int K, int I, int num_experts, int H) -> int64_t {
#ifdef FTW_WITH_CUDA
            return ftw::cuda::workspace_bytes(T, K, I, num_experts, H);
#else
            no_cuda();
#endif
        },
        "T"_a, "K"_a, "I"_a, "num_experts"_a, "H"_a,
        "Device workspace bytes one experts_forward call of a layer of width H needs (at T = 1 with "
        "room for the int8 x and activations of gguf's int8 units).");

    m.def(
        "cuda_routed_experts",
        [](int T, int K, int num_experts) -> double {
#ifdef FTW_WITH_CUDA
            return ftw::cuda::ggml_routed_experts(T, K, num_experts);
#else
            no_cuda();
#endif
        },
        "T"_a, "K"_a, "num_experts"_a,
        "The experts a gguf decode step counts as routed to, for its many-items rule (host only).");

    m.def(
        "cuda_decode_ksplit",
        [](int in, int vec, int blocks, int sms) -> int {
#ifdef FTW_WITH_CUDA
            return ftw::cuda::decode_ksplit(in, vec, blocks, sms);
#else
            no_cuda();
#endif
        },
        "in"_a, "vec"_a, "blocks"_a, "sms"_a,
        "Warps per block splitting a row in the register-fed decode kernel (launch shape rule; host only).");

    m.def(
        "cuda_experts_forward",
        [](const std::string& format, const std::vector<uintptr_t>& bank_base, const std::vector<int64_t>& row_bytes,
           uintptr_t slot_of_expert, int num_experts, int num_slots, int H, int I, int T, int K, uintptr_t x,
           uintptr_t topk_ids, uintptr_t topk_weights, uintptr_t out, uintptr_t workspace, int64_t workspace_bytes,
           const std::string& activation, float alpha, float limit, int block_out, int block_in,
           const std::string& scale_dtype, const std::string& bias_dtype, uintptr_t stream,
           const std::vector<int>& ggml_types) {
#ifdef FTW_WITH_CUDA
            if (bank_base.size() != row_bytes.size() || bank_base.size() > size_t(ftw::kMaxBanks))
                throw ftw::ShapeError("cuda experts: bank_base and row_bytes must have the same length, at most " +
                                      std::to_string(ftw::kMaxBanks));
            ftw::PoolLayerView view{};
            view.num_banks = int(bank_base.size());
            for (size_t k = 0; k < bank_base.size(); ++k) {
                view.bank_base[k] = reinterpret_cast<const uint8_t*>(bank_base[k]);
                view.row_bytes[k] = row_bytes[k];
            }
            view.slot_of_expert = reinterpret_cast<const int32_t*>(slot_of_expert);
            view.num_experts = num_experts;
            ftw::cuda::ExpertsProblem p;
            p.H = H, p.I = I, p.T = T, p.K = K;
            p.x = x, p.topk_ids = topk_ids, p.topk_weights = topk_weights, p.out = out;
            p.workspace = workspace, p.workspace_bytes = workspace_bytes, p.num_slots = num_slots;
            ftw::cuda::ActivationSpec act{act_kind(activation), alpha, limit};
            ftw::cuda::FormatOptions opt;
            opt.block_out = block_out, opt.block_in = block_in;
            opt.scale_dtype = scale_dtype, opt.bias_dtype = bias_dtype;
            if (!ggml_types.empty() && ggml_types.size() != 3)
                throw ftw::ShapeError("cuda experts: ggml_types must be the (gate, up, down) ggml type ids");
            for (size_t i = 0; i < ggml_types.size(); ++i) opt.ggml_types[i] = ggml_types[i];
            nb::gil_scoped_release release;
            ftw::cuda::experts_forward(format, view, p, act, opt, stream);
#else
            no_cuda();
#endif
        },
        "format"_a, "bank_base"_a, "row_bytes"_a, "slot_of_expert"_a, "num_experts"_a, "num_slots"_a, "H"_a, "I"_a,
        "T"_a, "K"_a, "x"_a, "topk_ids"_a, "topk_weights"_a, "out"_a, "workspace"_a, "workspace_bytes"_a,
        "activation"_a, "alpha"_a, "limit"_a, "block_out"_a, "block_in"_a, "scale_dtype"_a, "bias_dtype"_a,
        "stream"_a, "ggml_types"_a = std::vector<int>(),
        "Enqueue one MoE layer's routed experts on `stream` (all pointers are device addresses). "
        "Shapes, banks and options are checked before any launch. gguf layers pass ggml_types: the "
        "(gate, up, down) ggml type ids.");

    m.def(
        "cuda_stream_read",
        [](uintptr_t ptr, int64_t bytes, uintptr_t sink, uintptr_t stream) {
#ifdef FTW_WITH_CUDA
            ftw::cuda::stream_read(ptr, bytes, sink, stream);
#else
            no_cuda();
#endif
        },
        "ptr"_a, "nbytes"_a, "sink"_a, "stream"_a,
        "Read-only streaming kernel over nbytes at ptr (the bench's bandwidth ceiling); sink: 1024 uint32.");
}
