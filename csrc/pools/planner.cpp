#include "pools/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ftw::pools {

int64_t decode_need(int64_t batch, int top_k, int num_experts) {
    return std::min<int64_t>(batch * top_k, num_experts);
}

namespace {

std::string human(int64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(n);
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, ++u;
    char buf[64];
    std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void validate(const PlanRequest& r) {
    if (r.num_experts <= 0) throw FormatError("plan: the number of experts E must be positive");
    if (r.top_k <= 0 || r.top_k > r.num_experts)
        throw FormatError("plan: top_k must be in 1..E (got " + std::to_string(r.top_k) + ")");
    if (r.pools.empty()) throw FormatError("plan: no MoE layers to plan");
    if (r.bank_names.empty() || r.bank_names.size() > 64)
        throw FormatError("plan: expected 1..64 banks");
    if ((r.gpu_mem < 0) == (r.total_slots < 0))
        throw FormatError("plan: give exactly one budget, GPU memory or a total slot count");
    if (r.decode_batch < 0) throw FormatError("plan: the decode batch must be >= 0");
    if (r.prefill_chunk < 0) throw FormatError("plan: the prefill chunk must be >= 0");
    if (r.staging_experts < 1) throw FormatError("plan: staging needs at least 1 expert per half");
    for (const auto& p : r.pools) {
        if (p.row_bytes.size() != r.bank_names.size())
            throw FormatError("plan: pool " + p.key + " has " + std::to_string(p.row_bytes.size()) +
                              " bank row sizes, expected " + std::to_string(r.bank_names.size()));
        if (p.layers.empty()) throw FormatError("plan: pool " + p.key + " has no layers");
        int64_t total = 0;
        for (auto b : p.row_bytes) {
            if (b < 0) throw FormatError("plan: pool " + p.key + " has a negative row size");
            total += b;
        }
        if (total == 0) throw FormatError("plan: pool " + p.key + " has no bytes per expert");
    }
}

// Device bytes of the cache regions for the given slot counts (region alignment included).
int64_t slot_bytes(const Plan& plan, const std::vector<int64_t>& slots) {
    int64_t total = 0;
    for (size_t k = 0; k < plan.bank_names.size(); ++k)
        for (size_t i = 0; i < plan.pools.size(); ++i)
            total += round_up(slots[i] * plan.pools[i].stride[k], kRegionAlign);
    return total;
}

// Lays the regions out bank by bank: the pools in order, then the two staging halves.
void layout(Plan& plan) {
    const size_t nb = plan.bank_names.size();
    plan.staging_offset.assign(nb, 0);
    plan.bank_bytes.assign(nb, 0);
    plan.staging_bytes = 0;
    for (size_t k = 0; k < nb; ++k) {
        int64_t off = 0;
        for (auto& p : plan.pools) {
            p.offset[k] = off;
            off += round_up(p.slots * p.stride[k], kRegionAlign);
        }
        plan.staging_offset[k] = off;
        off += 2 * plan.staging_half[k];
        plan.bank_bytes[k] = off;
        plan.staging_bytes += 2 * plan.staging_half[k];
    }
    plan.total_bytes = plan.table_bytes;
    plan.total_slots = 0;
    for (auto b : plan.bank_bytes) plan.total_bytes += b;
    for (auto& p : plan.pools) plan.total_slots += p.slots;
}

}  // namespace

Plan make_plan(const PlanRequest& req) {
    validate(req);
    const int64_t E = req.num_experts;
    const size_t nb = req.bank_names.size();
    const size_t np = req.pools.size();
    Plan plan;
    plan.num_experts = req.num_experts;
    plan.top_k = req.top_k;
    plan.prefill_chunk = req.prefill_chunk;
    plan.bank_names = req.bank_names;
    for (const auto& s : req.pools) {
        PoolPlan p;
        p.key = s.key;
        p.layers = s.layers;
        p.row_bytes = s.row_bytes;
        p.experts = static_cast<int64_t>(s.layers.size()) * E;
        p.stride.resize(nb);
        p.offset.assign(nb, 0);
        for (size_t k = 0; k < nb; ++k) {
            p.stride[k] = s.row_bytes[k] ? round_up(s.row_bytes[k], kRowAlign) : 0;
            p.expert_bytes += p.stride[k];
        }
        plan.pools.push_back(p);
        plan.layer_rows += static_cast<int64_t>(s.layers.size());
    }
    // (layer, expert) -> slot for every layer, plus one [E] table per staging half
    plan.table_bytes = round_up((plan.layer_rows + 2) * E * 4, kRegionAlign);

    // Staging: its own region, shared by the pools (one layer is prefilled at a time), in two
    // halves so one group's copy overlaps the previous group's compute. A half holds
    // G = min(P, staging_experts) experts of the widest pool, and every other pool gets the
    // same bytes: G_p = min(P, floor(G * widest / expert_bytes_p)) experts (a pool of small
    // experts stages more per pass, never fewer). Each bank's half is the largest G_p * stride
    // over the pools. P = min(chunk * top_k, E) bounds the distinct experts one layer routes
    // one chunk to.
    plan.staging_half.assign(nb, 0);
    const int64_t P = req.prefill_chunk ? decode_need(req.prefill_chunk, req.top_k, req.num_experts) : 0;
    if (P) {
        int64_t widest = 0;
        for (auto& p : plan.pools) widest = std::max(widest, p.expert_bytes);
        const int64_t G = std::min<int64_t>(P, req.staging_experts);
        for (auto& p : plan.pools) p.staging_group = std::min(P, G * widest / p.expert_bytes);
        for (size_t k = 0; k < nb; ++k) {
            int64_t half = 0;
            for (auto& p : plan.pools) half = std::max(half, p.staging_group * p.stride[k]);
            plan.staging_half[k] = round_up(half, kRegionAlign);
        }
    }
    int64_t staging = 0;
    for (auto h : plan.staging_half) staging += 2 * h;

    // The cost of a budget in its own unit: slots, or device bytes.
    const bool by_slots = req.total_slots >= 0;
    auto cost = [&](const std::vector<int64_t>& slots) {
        if (!by_slots) return slot_bytes(plan, slots) + staging + plan.table_bytes;
        int64_t n = 0;
        for (auto s : slots) n += s;
        return n;
    };
    const int64_t budget = by_slots ? req.total_slots : req.gpu_mem;
    // Every pool holds one layer's decode step: min(B * top_k, E) slots, whatever its size.
    auto floors = [&](int64_t B) { return std::vector<int64_t>(np, decode_need(B, req.top_k, req.num_experts)); };
    const int64_t b_any = (E + req.top_k - 1) / req.top_k;  // from here on, D = E
    int64_t B = req.decode_batch;
    if (B == 0) {  // the largest B the budget holds (beyond b_any every B is the same)
        B = 1;
        while (B < b_any && cost(floors(B + 1)) <= budget) ++B;
    }
    std::vector<int64_t> slots = floors(B);
    plan.decode_batch = B >= b_any ? -1 : B;
    {
        // the minimum that holds this B (or B = 1 where nothing fits)
        int64_t need = 0;
        for (auto s : slots) need += s;
        plan.min_slots = need;
        plan.min_gpu_mem = slot_bytes(plan, slots) + staging + plan.table_bytes;
    }
    if (cost(slots) > budget) {
        std::string what = by_slots ? std::to_string(plan.min_slots) + " slots"
                                    : human(plan.min_gpu_mem) + " (" + std::to_string(plan.min_gpu_mem) + " bytes)";
        std::string have = by_slots ? std::to_string(budget) + " slots" : human(budget);
        throw CapacityError("plan: " + have + " cannot hold a decode batch of " + std::to_string(B) +
                            " in every pool (" + std::to_string(np) + " pools x " +
                            std::to_string(slots[0]) + " slots = min(B*top_k, E) each" +
                            (staging ? ", plus " + human(staging) + " of prefill staging" : "") +
                            "); the minimum is " + what);
    }

    // The rest goes to the pools so that each caches the same share f of its own experts
    // (equal share, equal miss rate per layer under the same routing statistics), never fewer
    // than the decode floor and never more than the pool's experts.
    auto at_share = [&](double f) {
        std::vector<int64_t> s(np);
        for (size_t i = 0; i < np; ++i) {
            auto want = static_cast<int64_t>(std::floor(f * double(plan.pools[i].experts)));
            s[i] = std::clamp<int64_t>(want, slots[i], plan.pools[i].experts);
        }
        return s;
    };
    double lo = 0.0, hi = 1.0;
    if (cost(at_share(1.0)) <= budget) {
        lo = 1.0;
    } else {
        for (int it = 0; it < 64; ++it) {
            double mid = 0.5 * (lo + hi);
            (cost(at_share(mid)) <= budget ? lo : hi) = mid;
        }
    }
    slots = at_share(lo);
    // whatever floor() left over: one slot at a time to the pool with the smallest share
    for (;;) {
        int best = -1;
        for (size_t i = 0; i < np; ++i) {
            if (slots[i] >= plan.pools[i].experts) continue;
            auto trial = slots;
            ++trial[i];
            if (cost(trial) > budget) continue;
            if (best < 0 || double(slots[i]) / plan.pools[i].experts <
                                double(slots[best]) / plan.pools[best].experts)
                best = static_cast<int>(i);
        }
        if (best < 0) break;
        ++slots[best];
    }
    for (size_t i = 0; i < np; ++i) {
        auto& p = plan.pools[i];
        p.slots = slots[i];
        p.decode_need = decode_need(B, req.top_k, req.num_experts);
        p.decode_batch = p.slots >= E ? -1 : p.slots / req.top_k;
    }
    layout(plan);
    return plan;
}

}  // namespace ftw::pools
