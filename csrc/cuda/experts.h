// The CUDA routed-expert runtime: one MoE layer's forward from the rows in a slot pool.
//
// Plain C++ (no CUDA or torch header) so the binding (csrc/bindings/bind_cuda_experts.cpp) can
// include it; pointers are device addresses carried as integers, the stream a cudaStream_t as an
// integer. The kernels live in csrc/cuda/experts_kernels.cuh (one templated family) and each
// format's weight decoder in csrc/formats/<name>/cuda.cu, which registers itself here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pools/pool_view.h"

namespace ftw::cuda {

// The activation between gate_up and down (ftw.formats.Activation):
//   silu:        out = silu(min(gate, limit)) * clamp(up, -limit, limit)   (limit = inf: none)
//   swiglu_oai:  g = min(gate, limit); u = clamp(up, -limit, limit); out = (u + 1) * g * sigmoid(alpha g)
enum class ActKind : int { Silu = 0, SwigluOai = 1 };

struct ActivationSpec {
    ActKind kind = ActKind::Silu;
    float alpha = 1.0f;
    float limit = 0.0f;  // <= 0 or inf: no clamp
};

// One layer-step. Shapes: x [T, H] bf16, topk_ids [T, K] int32, topk_weights [T, K] float32,
// out [T, H] float32 (overwritten: the weighted sum over the routed experts).
struct ExpertsProblem {
    int H = 0, I = 0, T = 0, K = 0;
    uintptr_t x = 0, topk_ids = 0, topk_weights = 0, out = 0;
    uintptr_t workspace = 0;  // device memory of workspace_bytes(T, K, I, E, H) bytes
    int64_t workspace_bytes = 0;
    int num_slots = 0;  // slots in the pool: slot_of_expert entries must be in [0, num_slots)
};

// Per-format typed options (the bindings fill them; C++ never parses JSON).
struct FormatOptions {
    int block_out = 128, block_in = 128;  // fp8_block block size
    std::string scale_dtype = "f32";      // fp8_block scales: "f32" or "bf16"
    std::string bias_dtype = "bf16";      // expert biases where present: "bf16" or "f32"
    int ggml_types[3] = {-1, -1, -1};     // gguf: ggml type ids of gate, up and down rows
};

// Device bytes the forward needs for its routing tables and the activations between gate_up
// and down (bf16 [T*K, I]); at T <= 8 also the tokens' x and the activations in integers for
// gguf's int8 units (kOptInt8 at T = 1, kOptInt8Tokens at T = 2..8; x of width H).
int64_t workspace_bytes(int T, int K, int I, int num_experts, int H);

// Checks everything it can without reading device memory (format name, bank row sizes and
// alignment, shapes, options) and throws ShapeError / FormatError / UnsupportedError before any
// launch; then enqueues the layer's kernels on `stream` (no host synchronisation, so the call can
// be captured in a CUDA graph). Expert ids out of range or not resident are caught on the device:
// the pair is skipped and error_flag() turns non-zero (the Python wrapper checks ids on the host
// first unless asked not to).
void experts_forward(const std::string& format, const PoolLayerView& view, const ExpertsProblem& p,
                     const ActivationSpec& act, const FormatOptions& opt, uintptr_t stream);

// Warps per block splitting a row of `in` inputs in the register-fed decode kernel, for a grid
// of `blocks` blocks on `sms` SMs (the launch shape rule of experts_kernels.cuh, host-only).
int decode_ksplit(int in, int vec, int blocks, int sms);

// The workspace's device error word: 0 when every routed pair was resident and in range, else
// 1 + the first bad pair index (t * K + k). Read it after the stream has run.
uintptr_t error_flag(uintptr_t workspace);

// Formats that have a CUDA kernel (registered by csrc/formats/<name>/cuda.cu), sorted.
std::vector<std::string> experts_formats();

// The ggml types the gguf format decodes on the GPU (csrc/formats/gguf/launch.cu), its table order.
std::vector<std::string> ggml_cuda_types();
// Those of them whose kernels are their own (registered by the build's slices), table order; the
// others run the table-driven decoder.
std::vector<std::string> ggml_cuda_own_decoders();
// The experts a gguf decode step of T tokens with top_k K counts as routed to, for its launch rules
// (host only, so the twin tests it; the rule and its measurements: routed_experts in
// csrc/formats/gguf/decoders.cuh).
double ggml_routed_experts(int T, int K, int num_experts);

// A read-only streaming kernel over `bytes` bytes at `ptr` (the bench's bandwidth ceiling);
// XORs what it read into `sink` (1024 uint32 words) so nothing is optimised away.
void stream_read(uintptr_t ptr, int64_t bytes, uintptr_t sink, uintptr_t stream);

}  // namespace ftw::cuda
