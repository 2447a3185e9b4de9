#include "pools/slot_pools.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ftw::pools {

SlotPools::SlotPools(Plan plan, std::vector<std::vector<int>> format_banks, Eviction eviction,
                     double lambda, std::unique_ptr<Backend> backend)
    : plan_(std::move(plan)),
      format_banks_(std::move(format_banks)),
      eviction_(eviction),
      lambda_(lambda),
      backend_(std::move(backend)),
      E_(plan_.num_experts) {
    const size_t nb = plan_.bank_names.size();
    if (format_banks_.size() != plan_.pools.size())
        throw FormatError("pools: one bank order per pool expected");
    if (!(lambda_ >= 0.0)) throw FormatError("pools: the LRFU lambda must be >= 0");
    for (size_t p = 0; p < plan_.pools.size(); ++p) {
        if (format_banks_[p].size() > static_cast<size_t>(kMaxBanks))
            throw FormatError("pools: format " + plan_.pools[p].key + " has more than 8 banks");
        for (int b : format_banks_[p])
            if (b >= static_cast<int>(nb)) throw FormatError("pools: bank index out of range");
        const auto& pp = plan_.pools[p];
        for (int layer : pp.layers) {
            if (row_of_layer_.count(layer))
                throw FormatError("pools: layer " + std::to_string(layer) + " is in two pools");
            row_of_layer_[layer] = static_cast<int>(layer_pool_.size());
            layer_pool_.push_back(static_cast<int>(p));
        }
        Pool pool;
        pool.owner.assign(static_cast<size_t>(pp.slots), -1);
        pool.rank.assign(static_cast<size_t>(pp.slots), {0.0, 0});
        for (int64_t s = pp.slots - 1; s >= 0; --s) pool.free.push_back(static_cast<int32_t>(s));
        pools_.push_back(std::move(pool));
    }
    stats_.assign(plan_.pools.size(), {});
    const size_t rows = layer_pool_.size();
    for (size_t k = 0; k < nb; ++k) bank_dev_.push_back(backend_->alloc(plan_.bank_bytes[k]));
    table_.assign((rows + 2) * E_, -1);
    table_dev_ = reinterpret_cast<int32_t*>(backend_->alloc(plan_.table_bytes));
    // the device table starts as all -1: one batch of the whole mirror
    CopyBatch init;
    auto* up = reinterpret_cast<int32_t*>(backend_->upload(static_cast<int64_t>(table_.size()) * 4));
    std::memcpy(up, table_.data(), table_.size() * 4);
    init.add(up, table_dev_, static_cast<int64_t>(table_.size()) * 4);
    backend_->submit(init, 0);
    backend_->sync();
    host_.assign(nb, std::vector<const uint8_t*>(rows, nullptr));
    crf_.assign(rows * E_, 0.0);
    crf_tick_.assign(rows * E_, 0);
}

int SlotPools::row_of(int layer) const {
    auto it = row_of_layer_.find(layer);
    if (it == row_of_layer_.end())
        throw FormatError("pools: layer " + std::to_string(layer) + " is in no pool");
    return it->second;
}

void SlotPools::set_host_bank(int bank, int layer, const void* data, int64_t nbytes) {
    const int row = row_of(layer);
    if (bank < 0 || bank >= static_cast<int>(plan_.bank_names.size()))
        throw FormatError("pools: bank index " + std::to_string(bank) + " out of range");
    const auto& pp = plan_.pools[layer_pool_[row]];
    const std::string what = "bank " + plan_.bank_names[bank] + " of layer " + std::to_string(layer);
    const int64_t want = pp.row_bytes[bank] * E_;
    if (nbytes != want)
        throw FormatError("pools: " + what + " has " + std::to_string(nbytes) + " bytes, expected " +
                          std::to_string(E_) + " rows of " + std::to_string(pp.row_bytes[bank]) +
                          " (format " + pp.key + ")");
    host_[bank][row] = nbytes ? static_cast<const uint8_t*>(backend_->source(data, nbytes, what)) : nullptr;
}

void SlotPools::touch(int pool, int32_t slot, int64_t key) {
    double prio = 0.0;  // LRU: the sequence number alone orders
    if (eviction_ == Eviction::lrfu) {
        // LRFU: C(t) = 1 + C(t_prev) * 2^(-lambda (t - t_prev)). Ranking by C at a common time
        // equals ranking by lambda * t_last + log2 C(t_last), a key that never needs updating.
        double c = 1.0 + crf_[key] * std::exp2(-lambda_ * double(tick_ - crf_tick_[key]));
        crf_[key] = c;
        crf_tick_[key] = tick_;
        prio = lambda_ * double(tick_) + std::log2(c);
    }
    auto& p = pools_[pool];
    p.rank[slot] = {prio, ++seq_};
    p.order.emplace(prio, seq_, slot);
}

void SlotPools::copy_rows(CopyBatch& batch, int pool, int row, int expert, uint8_t* const* base,
                          const std::vector<int64_t>& offset, int64_t slot) {
    const auto& pp = plan_.pools[pool];
    auto& st = stats_[pool];
    for (size_t k = 0; k < plan_.bank_names.size(); ++k) {
        const int64_t n = pp.row_bytes[k];
        if (!n) continue;  // the format lacks this bank: zero bytes, no copy
        batch.add(host_[k][row] + n * expert, base[k] + offset[k] + slot * pp.stride[k], n);
        ++st.copy_ops;
        st.copy_bytes += n;
    }
}

void SlotPools::upload_rows(CopyBatch& batch, const std::vector<std::pair<const int32_t*, int32_t*>>& rows) {
    if (rows.empty()) return;
    auto* up = reinterpret_cast<int32_t*>(backend_->upload(static_cast<int64_t>(rows.size()) * E_ * 4));
    for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(up + i * E_, rows[i].first, static_cast<size_t>(E_) * 4);
        batch.add(up + i * E_, rows[i].second, int64_t(E_) * 4);
    }
}

std::vector<std::vector<int32_t>> SlotPools::request(const std::vector<int>& layers,
                                                     const std::vector<std::vector<int32_t>>& experts) {
    if (layers.size() != experts.size()) throw FormatError("pools: one expert list per layer expected");
    // validate everything and check capacity before any state changes
    std::vector<int> rows(layers.size());
    std::vector<int64_t> wanted(pools_.size(), 0);
    std::vector<int64_t> seen;  // keys of this request, to count distinct experts
    for (size_t i = 0; i < layers.size(); ++i) {
        rows[i] = row_of(layers[i]);
        const int p = layer_pool_[rows[i]];
        for (size_t k = 0; k < plan_.bank_names.size(); ++k)
            if (plan_.pools[p].row_bytes[k] && !host_[k][rows[i]])
                throw FormatError("pools: no host rows for bank " + plan_.bank_names[k] + " of layer " +
                                  std::to_string(layers[i]));
        for (int32_t e : experts[i]) {
            if (e < 0 || e >= E_)
                throw FormatError("pools: expert id " + std::to_string(e) + " of layer " +
                                  std::to_string(layers[i]) + " outside 0.." + std::to_string(E_ - 1));
            seen.push_back(int64_t(rows[i]) * E_ + e);
        }
    }
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int64_t key : seen) ++wanted[layer_pool_[key / E_]];
    for (size_t p = 0; p < pools_.size(); ++p)
        if (wanted[p] > plan_.pools[p].slots)
            throw CapacityError("pools: this step needs " + std::to_string(wanted[p]) +
                                " distinct experts at once in pool " + plan_.pools[p].key + ", which has " +
                                std::to_string(plan_.pools[p].slots) +
                                " slots; split the step (fewer tokens or layers per request)");

    // hits first: taken out of the eviction order, so no miss of this step can evict them
    std::vector<int32_t> slot_of_key(seen.size(), -1);
    for (size_t i = 0; i < seen.size(); ++i) {
        const int64_t key = seen[i];
        const int32_t s = table_[key];
        if (s < 0) continue;
        auto& pool = pools_[layer_pool_[key / E_]];
        pool.order.erase({pool.rank[s].first, pool.rank[s].second, s});
        slot_of_key[i] = s;
        ++stats_[layer_pool_[key / E_]].hits;
    }
    CopyBatch batch;
    std::vector<char> dirty(layer_pool_.size(), 0);
    std::vector<int> dirty_rows;
    auto mark = [&](int row) {
        if (!dirty[row]) dirty[row] = 1, dirty_rows.push_back(row);
    };
    for (size_t i = 0; i < seen.size(); ++i) {
        if (slot_of_key[i] >= 0) continue;
        const int64_t key = seen[i];
        const int row = static_cast<int>(key / E_);
        const int p = layer_pool_[row];
        auto& pool = pools_[p];
        int32_t s;
        if (!pool.free.empty()) {
            s = pool.free.back();
            pool.free.pop_back();
        } else {  // capacity was checked: an unpinned slot exists
            auto victim = pool.order.begin();
            s = std::get<2>(*victim);
            pool.order.erase(victim);
            const int64_t old = pool.owner[s];
            table_[old] = -1;
            mark(static_cast<int>(old / E_));
            ++stats_[p].evictions;
        }
        pool.owner[s] = key;
        table_[key] = s;
        slot_of_key[i] = s;
        mark(row);
        ++stats_[p].misses;
        copy_rows(batch, p, row, static_cast<int>(key % E_), bank_dev_.data(), plan_.pools[p].offset, s);
    }
    for (size_t i = 0; i < seen.size(); ++i) touch(layer_pool_[seen[i] / E_], slot_of_key[i], seen[i]);

    std::vector<std::pair<const int32_t*, int32_t*>> up;
    for (int row : dirty_rows) up.push_back({table_.data() + int64_t(row) * E_, table_dev_ + int64_t(row) * E_});
    upload_rows(batch, up);
    backend_->submit(batch, 0);  // an empty batch launches nothing (and says so in last_*)

    std::vector<std::vector<int32_t>> out(layers.size());
    for (size_t i = 0; i < layers.size(); ++i)
        for (int32_t e : experts[i]) out[i].push_back(table_[int64_t(rows[i]) * E_ + e]);
    return out;
}

PrefillPlan SlotPools::prefill(int layer, const std::vector<int32_t>& experts) {
    const int row = row_of(layer);
    const int p = layer_pool_[row];
    std::vector<int32_t> ids(experts);
    for (int32_t e : ids)
        if (e < 0 || e >= E_)
            throw FormatError("pools: expert id " + std::to_string(e) + " of layer " + std::to_string(layer) +
                              " outside 0.." + std::to_string(E_ - 1));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    PrefillPlan out;
    std::vector<int32_t> misses;
    auto& pool = pools_[p];
    for (int32_t e : ids) {
        const int64_t key = int64_t(row) * E_ + e;
        const int32_t s = table_[key];
        if (s < 0) {
            misses.push_back(e);
            continue;
        }
        out.hits.push_back(e);
        pool.order.erase({pool.rank[s].first, pool.rank[s].second, s});
        touch(p, s, key);
        ++stats_[p].hits;
    }
    const int64_t G = plan_.pools[p].staging_group;
    if (!misses.empty() && G <= 0)
        throw CapacityError("pools: layer " + std::to_string(layer) + " needs " + std::to_string(misses.size()) +
                            " experts staged for prefill, but no staging was planned (plan with a prefill chunk)");
    for (size_t i = 0; i < misses.size(); i += static_cast<size_t>(G))
        out.groups.emplace_back(misses.begin() + i,
                                misses.begin() + std::min(misses.size(), i + static_cast<size_t>(G)));
    return out;
}

PoolLayerView SlotPools::stage(int layer, const std::vector<int32_t>& group) {
    const int row = row_of(layer);
    const int p = layer_pool_[row];
    const auto& pp = plan_.pools[p];
    if (static_cast<int64_t>(group.size()) > pp.staging_group)
        throw CapacityError("pools: a staging group of " + std::to_string(group.size()) + " experts for pool " +
                            pp.key + ", which stages at most " + std::to_string(pp.staging_group) +
                            " per half");
    for (size_t k = 0; k < plan_.bank_names.size(); ++k)
        if (pp.row_bytes[k] && !host_[k][row])
            throw FormatError("pools: no host rows for bank " + plan_.bank_names[k] + " of layer " +
                              std::to_string(layer));
    half_ = 1 - half_;
    int32_t* tab = table_.data() + (int64_t(layer_pool_.size()) + half_) * E_;
    std::fill(tab, tab + E_, -1);
    for (size_t i = 0; i < group.size(); ++i) {
        const int32_t e = group[i];
        if (e < 0 || e >= E_) throw FormatError("pools: expert id " + std::to_string(e) + " out of range");
        if (tab[e] >= 0) throw FormatError("pools: expert " + std::to_string(e) + " twice in one staging group");
        tab[e] = static_cast<int32_t>(i);
    }
    CopyBatch batch;
    std::vector<int64_t> offset(plan_.bank_names.size());
    for (size_t k = 0; k < offset.size(); ++k)
        offset[k] = plan_.staging_offset[k] + half_ * plan_.staging_half[k];
    for (size_t i = 0; i < group.size(); ++i)
        copy_rows(batch, p, row, group[i], bank_dev_.data(), offset, static_cast<int64_t>(i));
    stats_[p].staged += static_cast<int64_t>(group.size());
    upload_rows(batch, {{tab, table_dev_ + (int64_t(layer_pool_.size()) + half_) * E_}});
    backend_->submit(batch, 1 + half_);
    half_pool_[half_] = p;

    PoolLayerView v{};
    const auto& fb = format_banks_[p];
    v.num_banks = static_cast<int>(fb.size());
    for (size_t j = 0; j < fb.size(); ++j) {
        const int b = fb[j];
        if (b >= 0 && pp.stride[b]) {
            v.bank_base[j] = bank_dev_[b] + offset[b];
            v.row_bytes[j] = pp.stride[b];
        }
    }
    v.slot_of_expert = table_dev_ + (int64_t(layer_pool_.size()) + half_) * E_;
    v.num_experts = E_;
    return v;
}

PoolLayerView SlotPools::view(int layer) const {
    const int row = row_of(layer);
    const int p = layer_pool_[row];
    const auto& pp = plan_.pools[p];
    PoolLayerView v{};
    const auto& fb = format_banks_[p];
    v.num_banks = static_cast<int>(fb.size());
    for (size_t j = 0; j < fb.size(); ++j) {
        const int b = fb[j];
        if (b >= 0 && pp.stride[b]) {
            v.bank_base[j] = bank_dev_[b] + pp.offset[b];
            v.row_bytes[j] = pp.stride[b];
        }
    }
    v.slot_of_expert = table_dev_ + int64_t(row) * E_;
    v.num_experts = E_;
    return v;
}

void SlotPools::reset_stats() { stats_.assign(plan_.pools.size(), {}); }

int32_t SlotPools::slot_of(int layer, int expert) const {
    if (expert < 0 || expert >= E_) throw FormatError("pools: expert id out of range");
    return table_[int64_t(row_of(layer)) * E_ + expert];
}

std::vector<uint8_t> SlotPools::read_slot(int pool, int bank, int64_t slot) {
    const auto& pp = plan_.pools.at(pool);
    if (bank < 0 || bank >= static_cast<int>(pp.row_bytes.size()) || slot < 0 || slot >= pp.slots)
        throw FormatError("pools: read_slot out of range");
    std::vector<uint8_t> out(static_cast<size_t>(pp.row_bytes[bank]));
    backend_->sync();
    if (!out.empty()) backend_->read(out.data(), bank_dev_[bank] + pp.offset[bank] + slot * pp.stride[bank], pp.row_bytes[bank]);
    return out;
}

std::vector<uint8_t> SlotPools::read_staging(int half, int pool, int bank, int64_t index) {
    const auto& pp = plan_.pools.at(pool);
    if (half < 0 || half > 1 || bank < 0 || bank >= static_cast<int>(pp.row_bytes.size()) || index < 0 ||
        index >= pp.staging_group)
        throw FormatError("pools: read_staging out of range");
    std::vector<uint8_t> out(static_cast<size_t>(pp.row_bytes[bank]));
    backend_->sync();
    if (!out.empty())
        backend_->read(out.data(),
                       bank_dev_[bank] + plan_.staging_offset[bank] + half * plan_.staging_half[bank] + index * pp.stride[bank],
                       pp.row_bytes[bank]);
    return out;
}

std::vector<int32_t> SlotPools::read_table() {
    std::vector<int32_t> out(table_.size());
    backend_->sync();
    backend_->read(out.data(), table_dev_, static_cast<int64_t>(out.size()) * 4);
    return out;
}

}  // namespace ftw::pools
