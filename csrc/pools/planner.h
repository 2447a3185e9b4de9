// The pool planner: how many slots each format's pool gets, where its regions lie in each bank
// buffer, and how large the prefill staging region is. Pure arithmetic (no memory is touched),
// so `ftw plan` and the runtime run the same code. docs/RUNTIME.md states the policy and why
// it avoids each known trap of the engine this project serves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"

namespace ftw::pools {

// A request the pools cannot hold (a step with more distinct experts of one pool than the
// pool has slots; a budget below the minimum) -> ftw.runtime.pools.CapacityError.
struct CapacityError : ::ftw::Error {
    using ::ftw::Error::Error;
};

constexpr int64_t kRowAlign = 16;      // slot stride: a row rounded up to this (vector loads)
constexpr int64_t kRegionAlign = 256;  // each pool's region and the staging region start here

inline int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

struct PoolSpec {
    std::string key;                // the format's label (name + options)
    std::vector<int> layers;        // model layer ids in this pool
    std::vector<int64_t> row_bytes; // per bank of the model's union; 0 where the format lacks it
};

struct PlanRequest {
    int num_experts = 0;              // E
    int top_k = 0;
    std::vector<std::string> bank_names;  // the model's union of banks
    std::vector<PoolSpec> pools;
    int64_t gpu_mem = -1;             // bytes for pools + staging + tables, or -1
    int64_t total_slots = -1;         // or: cache slots over all pools (staging not counted)
    int decode_batch = 0;             // 0: the largest the budget allows
    int prefill_chunk = 0;            // tokens per prefill chunk; 0: no staging
    int staging_experts = 8;          // experts per staging half of the widest pool
};

struct PoolPlan {
    std::string key;
    std::vector<int> layers;
    std::vector<int64_t> row_bytes;   // per bank: the row's bytes (0 = bank absent)
    std::vector<int64_t> stride;      // per bank: slot stride (row rounded up to kRowAlign)
    std::vector<int64_t> offset;      // per bank: this pool's region in the bank buffer
    int64_t expert_bytes = 0;         // sum of strides: device bytes per slot
    int64_t slots = 0;                // cache slots
    int64_t decode_need = 0;          // min(B * top_k, E) for the planned B
    int64_t decode_batch = 0;         // largest B with min(B * top_k, E) <= slots; -1 = any B
    int64_t staging_group = 0;        // experts per staging half in a prefill pass
    int64_t experts = 0;              // layers * E: the pool's experts in host memory
    int64_t bytes() const { return slots * expert_bytes; }
    double share() const { return experts ? double(slots) / double(experts) : 0.0; }
};

struct Plan {
    int num_experts = 0;
    int top_k = 0;
    int prefill_chunk = 0;
    std::vector<std::string> bank_names;
    std::vector<PoolPlan> pools;
    int64_t decode_batch = 0;               // planned B (every pool holds min(B*top_k, E))
    std::vector<int64_t> staging_offset;    // per bank
    std::vector<int64_t> staging_half;      // per bank: bytes of one staging half
    std::vector<int64_t> bank_bytes;        // per bank: whole buffer (pools + staging)
    int64_t staging_bytes = 0;              // both halves, all banks
    int64_t table_bytes = 0;                // (layer, expert) -> slot table + staging tables
    int64_t total_bytes = 0;                // everything on the device
    int64_t total_slots = 0;
    int64_t layer_rows = 0;                 // layers in all pools (rows of the slot table)
    // Minimum budget that holds decode batch `decode_batch` (or 1 when it does not fit).
    int64_t min_gpu_mem = 0;
    int64_t min_slots = 0;
};

// Plans the pools or throws CapacityError naming the minimum budget that would fit.
Plan make_plan(const PlanRequest& req);

// min(B * top_k, E): the slots one layer's decode step needs at once.
int64_t decode_need(int64_t batch, int top_k, int num_experts);

}  // namespace ftw::pools
