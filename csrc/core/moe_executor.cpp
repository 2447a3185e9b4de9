#include "core/moe_executor.h"

#include <algorithm>
#include <cstring>

#include "core/format_registry.h"

namespace ftw::cpu {

namespace {

constexpr int64_t kRowBlock = 32;  // rows per task: enough tasks to balance, enough work per task

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

MoeExecutor::MoeExecutor(int threads) : pool_(threads) {}

int MoeExecutor::add_format(const std::string& name, const Options& options) {
    const FormatInfo* info = find_format(name);
    if (!info) {
        std::string known;
        for (const auto& n : format_names()) known += (known.empty() ? "" : ", ") + n;
        throw UnsupportedError("format '" + name + "' has no CPU kernel (CPU formats: " + known + ")");
    }
    formats_.push_back(info->make(options));
    format_names_.push_back(name);
    return int(formats_.size()) - 1;
}

void MoeExecutor::add_layer(int64_t layer, int format_index, LayerBanks banks, const Activation& act) {
    if (format_index < 0 || format_index >= int(formats_.size()))
        throw Error("layer " + std::to_string(layer) + ": no format " + std::to_string(format_index));
    const Format* f = formats_[format_index].get();
    const std::string where = "layer " + std::to_string(layer) + " (" + format_names_[format_index] + ")";
    std::vector<BankNeed> needs;
    try {
        needs = f->needs(banks.H, banks.I);
    } catch (const FormatError& e) {
        throw FormatError(where + ": " + e.what());
    }
    for (const BankNeed& need : needs) {
        auto it = banks.banks.find(need.name);
        if (it == banks.banks.end() || !it->second.present) {
            if (need.optional) continue;
            throw FormatError(where + ": bank '" + need.name + "' is missing");
        }
        const Bank& b = it->second;
        if (std::find(need.dtypes.begin(), need.dtypes.end(), b.dtype) == need.dtypes.end()) {
            std::string want;
            for (DType d : need.dtypes) want += (want.empty() ? "" : "/") + std::string(dtype_name(d));
            throw FormatError(where + ": bank '" + need.name + "' is " + dtype_name(b.dtype) + ", expected " + want);
        }
        const int64_t bytes = need.elements * dtype_size(b.dtype);
        if (b.expert_bytes != bytes)
            throw FormatError(where + ": bank '" + need.name + "' has " + std::to_string(b.expert_bytes) +
                              " bytes per expert, expected " + std::to_string(bytes) + " at H=" +
                              std::to_string(banks.H) + ", I=" + std::to_string(banks.I));
    }
    auto [it, inserted] = layers_.emplace(layer, Layer{f, std::move(banks), act});
    if (!inserted) throw Error("layer " + std::to_string(layer) + " was added twice");
    Layer& stored = it->second;
    stored.gate_up_bias = stored.banks.has("gate_up_bias") ? &stored.banks.at("gate_up_bias") : nullptr;
    stored.down_bias = stored.banks.has("down_bias") ? &stored.banks.at("down_bias") : nullptr;
}

const MoeExecutor::Layer& MoeExecutor::layer(int64_t layer) const {
    auto it = layers_.find(layer);
    if (it == layers_.end()) {
        std::vector<int64_t> ids;
        for (const auto& kv : layers_) ids.push_back(kv.first);
        std::sort(ids.begin(), ids.end());
        std::string known;
        for (int64_t l : ids) known += (known.empty() ? "" : ", ") + std::to_string(l);
        throw FormatError("the executor has no MoE layer " + std::to_string(layer) + " (layers: " + known + ")");
    }
    return it->second;
}

const LayerBanks& MoeExecutor::layer_banks(int64_t l) const { return layer(l).banks; }

void MoeExecutor::forward(int64_t layer_id, int64_t T, int64_t k, const float* X, const int64_t* ids,
                          const float* w, float* out) {
    const Layer& L = layer(layer_id);
    const int64_t H = L.banks.H, I = L.banks.I, E = L.banks.E;
    const Format& f = *L.format;

    // Group the (token, slot) pairs by expert: expert u's slots are [off[u], off[u + 1]).
    std::vector<int64_t> count(E, 0);
    for (int64_t i = 0; i < T * k; ++i) ++count[ids[i]];
    std::vector<int64_t> experts, off = {0};
    for (int64_t e = 0; e < E; ++e)
        if (count[e]) {
            experts.push_back(e);
            off.push_back(off.back() + count[e]);
        }
    const int64_t U = int64_t(experts.size()), S = T * k;
    std::vector<int64_t> slot_token(S);
    std::vector<float> slot_weight(S);
    {
        std::vector<int64_t> pos(E, -1);
        for (int64_t u = 0; u < U; ++u) pos[experts[u]] = off[u];
        for (int64_t i = 0; i < S; ++i) {
            const int64_t s = pos[ids[i]]++;
            slot_token[s] = i / k;
            slot_weight[s] = w[i];
        }
    }

    // Each slot's input row, gathered by expert (and quantized where the format asks).
    std::vector<float> Xs(size_t(S * H));
    for (int64_t s = 0; s < S; ++s) std::memcpy(&Xs[s * H], X + slot_token[s] * H, size_t(H) * sizeof(float));
    if (f.transforms_inputs()) f.transform_inputs(Xs.data(), H, S, H);

    // Phase 1: gate and up rows of block b for the tokens of expert u, then the activation.
    std::vector<float> A(size_t(S * I));
    const int64_t nb1 = cdiv(I, kRowBlock);
    struct Group { int64_t u, s0, n; };
    std::vector<Group> groups;  // an expert's slots in runs of at most kMaxTokens
    for (int64_t u = 0; u < U; ++u)
        for (int64_t s0 = off[u]; s0 < off[u + 1]; s0 += kMaxTokens)
            groups.push_back({u, s0, std::min(kMaxTokens, off[u + 1] - s0)});
    pool_.parallel_for(int64_t(groups.size()) * nb1, [&](int64_t task) {
        const Group& g = groups[task / nb1];
        const int64_t e = experts[g.u];
        const int64_t i0 = (task % nb1) * kRowBlock, i1 = std::min(I, i0 + kRowBlock), rb = i1 - i0;
        float gate[kMaxTokens * kRowBlock], up[kMaxTokens * kRowBlock];
        const float* x = &Xs[g.s0 * H];
        f.matmul(L.banks, {e, Proj::GateUp, i0, i1, x, H, g.n, gate, rb});
        f.matmul(L.banks, {e, Proj::GateUp, I + i0, I + i1, x, H, g.n, up, rb});
        const uint8_t* gb = L.gate_up_bias ? L.gate_up_bias->expert(e) : nullptr;
        for (int64_t j = 0; j < g.n; ++j)
            for (int64_t i = i0; i < i1; ++i) {
                float gv = gate[j * rb + (i - i0)], uv = up[j * rb + (i - i0)];
                if (gb) {
                    gv += load_float(gb, L.gate_up_bias->dtype, i);
                    uv += load_float(gb, L.gate_up_bias->dtype, I + i);
                }
                A[(g.s0 + j) * I + i] = L.act(gv, uv);
            }
    });
    if (f.transforms_inputs()) f.transform_inputs(A.data(), I, S, I);

    // Phase 2: down rows of block b for every used expert, weighted into out.
    std::memset(out, 0, size_t(T * H) * sizeof(float));
    const int64_t nb2 = cdiv(H, kRowBlock);
    pool_.parallel_for(nb2, [&](int64_t b) {
        const int64_t h0 = b * kRowBlock, h1 = std::min(H, h0 + kRowBlock), rb = h1 - h0;
        float y[kMaxTokens * kRowBlock];
        for (const Group& g : groups) {
            const int64_t e = experts[g.u];
            f.matmul(L.banks, {e, Proj::Down, h0, h1, &A[g.s0 * I], I, g.n, y, rb});
            const uint8_t* db = L.down_bias ? L.down_bias->expert(e) : nullptr;
            for (int64_t j = 0; j < g.n; ++j) {
                const int64_t s = g.s0 + j;
                float* o = out + slot_token[s] * H;
                const float wt = slot_weight[s];
                for (int64_t h = h0; h < h1; ++h) {
                    float v = y[j * rb + (h - h0)];
                    if (db) v += load_float(db, L.down_bias->dtype, h);
                    o[h] += wt * v;
                }
            }
        }
    });
}

}  // namespace ftw::cpu
