// The CPU MoE executor: routed experts of one layer for T tokens, each layer in its own format.
//
// forward(): hidden [T, H] float32, topk ids/weights [T, k] -> out [T, H] float32:
//   out[t] = sum_j w[t, j] * (down_e (act(gate_e x_t + gate_bias_e, up_e x_t + up_bias_e)) + down_bias_e)
// Two parallel phases over the thread pool: (1) per used expert and block of intermediate rows,
// gate and up rows times that expert's tokens, then the activation; (2) per block of output
// rows, the down rows of every used expert, accumulated into out (each task owns its rows, so
// no atomics and a fixed summation order). Weights are dequantized inside the products.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/activation.h"
#include "core/cpu_format.h"
#include "core/thread_pool.h"

namespace ftw::cpu {

class MoeExecutor {
public:
    explicit MoeExecutor(int threads);

    int threads() const { return pool_.size(); }

    // A kernel for (name, options); returns its index. UnsupportedError for a format the
    // registry lacks or options (ggml types) it cannot compute; FormatError for bad options.
    int add_format(const std::string& name, const Options& options);

    // Layer `layer` computed by format `format_index`. Checks every bank the format reads
    // (present, dtype, bytes per expert) before anything is read; errors name the layer.
    void add_layer(int64_t layer, int format_index, LayerBanks banks, const Activation& act);

    bool has_layer(int64_t layer) const { return layers_.count(layer) != 0; }
    const LayerBanks& layer_banks(int64_t layer) const;

    // X [T, H], ids [T, k] (validated by the caller: 0 <= id < E), w [T, k], out [T, H].
    void forward(int64_t layer, int64_t T, int64_t k, const float* X, const int64_t* ids, const float* w,
                 float* out);

private:
    struct Layer {
        const Format* format;
        LayerBanks banks;
        Activation act;
        const Bank* gate_up_bias = nullptr;
        const Bank* down_bias = nullptr;
    };

    const Layer& layer(int64_t layer) const;

    ThreadPool pool_;
    std::vector<std::unique_ptr<Format>> formats_;
    std::vector<std::string> format_names_;
    std::unordered_map<int64_t, Layer> layers_;
};

}  // namespace ftw::cpu
