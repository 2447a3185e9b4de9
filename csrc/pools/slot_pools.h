// Per-format slot pools: one pool per format (name + options), each with its own slots, its
// own eviction order and its own row size per bank; a (layer, expert) -> slot table that
// kernels read on the device; misses filled from the host banks in one batched copy per step.
// The same code drives the host twin and the CUDA backend (backend.h).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "pools/backend.h"
#include "pools/planner.h"
#include "pools/pool_view.h"

namespace ftw::pools {

enum class Eviction {
    lru,   // least recently used
    lrfu,  // frequency-weighted LRU (LRFU): rank by sum over past uses of 2^(-lambda * age)
};

struct PoolStats {
    int64_t hits = 0, misses = 0, evictions = 0;
    int64_t staged = 0;      // experts copied into staging for prefill
    int64_t copy_ops = 0;    // row copies issued (never one for a bank the format lacks)
    int64_t copy_bytes = 0;
};

// What one prefill chunk of one layer needs: experts already resident (computed from the cache
// as they are) and the missing ones in groups that each fit one staging half.
struct PrefillPlan {
    std::vector<int32_t> hits;
    std::vector<std::vector<int32_t>> groups;
};

class SlotPools {
public:
    // format_banks[p]: for pool p, its format's banks in the format's order, as indices into
    // plan.bank_names (-1 for a format bank the model does not have).
    SlotPools(Plan plan, std::vector<std::vector<int>> format_banks, Eviction eviction, double lambda,
              std::unique_ptr<Backend> backend);

    const Plan& plan() const { return plan_; }
    Backend& backend() { return *backend_; }

    // The host rows of one bank of one layer: E rows of the pool's row size, contiguous.
    void set_host_bank(int bank, int layer, const void* data, int64_t nbytes);

    // Starts a step (a decode token or a prefill chunk): the clock of the eviction order.
    void begin_step() { ++tick_; }

    // Decode: makes every listed expert of every listed layer resident at once and returns
    // their slots (in order, per layer). All misses go out as one batch. A pool asked for more
    // distinct experts than it has slots is refused before anything changes (CapacityError).
    std::vector<std::vector<int32_t>> request(const std::vector<int>& layers,
                                              const std::vector<std::vector<int32_t>>& experts);

    // Prefill: splits the chunk's distinct experts of `layer` into hits and staging groups.
    // Touches the hits' recency; evicts nothing.
    PrefillPlan prefill(int layer, const std::vector<int32_t>& experts);
    // Copies one group into the next staging half (one batch) and returns the view of it.
    PoolLayerView stage(int layer, const std::vector<int32_t>& group);

    // Where a kernel finds `layer`'s resident experts.
    PoolLayerView view(int layer) const;

    // Makes the compute stream wait for the copies of a channel (0 = cache, 1/2 = staging
    // halves, backend.h), and marks the compute queued so far as a staging half's last reader.
    void join(int channel) { backend_->join(channel); }
    void release(int channel) { backend_->release(channel); }
    void sync() { backend_->sync(); }

    int pool_of(int layer) const { return layer_pool_.at(row_of(layer)); }
    const PoolStats& stats(int pool) const { return stats_.at(pool); }
    void reset_stats();
    int32_t slot_of(int layer, int expert) const;  // host mirror of the device table
    // Device bytes for tests: a slot's row, a staged row, the device table.
    std::vector<uint8_t> read_slot(int pool, int bank, int64_t slot);
    std::vector<uint8_t> read_staging(int half, int pool, int bank, int64_t index);
    std::vector<int32_t> read_table();
    int last_half() const { return half_; }

private:
    struct Pool {
        std::vector<int64_t> owner;  // slot -> key (row * E + expert), -1 when free
        std::vector<int32_t> free;
        std::set<std::tuple<double, uint64_t, int32_t>> order;  // evictable: (priority, seq, slot)
        std::vector<std::pair<double, uint64_t>> rank;          // slot -> its key in `order`
    };
    int row_of(int layer) const;
    void touch(int pool, int32_t slot, int64_t key);  // (re)inserts with a fresh priority
    void copy_rows(CopyBatch& batch, int pool, int row, int expert, uint8_t* const* base,
                   const std::vector<int64_t>& offset, int64_t slot);
    void upload_rows(CopyBatch& batch, const std::vector<std::pair<const int32_t*, int32_t*>>& rows);

    Plan plan_;
    std::vector<std::vector<int>> format_banks_;
    Eviction eviction_;
    double lambda_;
    std::unique_ptr<Backend> backend_;
    int E_;
    std::unordered_map<int, int> row_of_layer_;  // model layer id -> table row
    std::vector<int> layer_pool_;                 // table row -> pool
    std::vector<Pool> pools_;
    std::vector<PoolStats> stats_;
    std::vector<uint8_t*> bank_dev_;              // per bank: the device buffer
    int32_t* table_dev_ = nullptr;                // [rows * E] then [2 * E] staging tables
    std::vector<int32_t> table_;                  // host mirror of the same
    // host rows: [bank][row] -> source address (as the backend reads it), row bytes
    std::vector<std::vector<const uint8_t*>> host_;
    std::vector<double> crf_;                     // LRFU: combined recency-frequency per key
    std::vector<int64_t> crf_tick_;
    int64_t tick_ = 0;
    uint64_t seq_ = 0;
    int half_ = 1;                                // staging half used last
    std::vector<int> half_pool_{-1, -1};          // which pool's rows each half holds
};

}  // namespace ftw::pools
