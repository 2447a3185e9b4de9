// How a kernel finds one MoE layer's expert rows in a slot pool (the contract between the
// slot pools, csrc/pools/, and the per-format kernels, csrc/formats/<format>/).
//
// Plain C++ with no CUDA or torch header, so both the CPU executor and .cu kernels include it.
//
// A pool serves every layer of one format (name + options). Each bank (gate_up, down,
// gate_up_scale, ...) is one device buffer cut into one region per pool; expert e of a layer
// lives in slot s = slot_of_expert[e] of its pool, and the row of bank k is at
//     bank_base[k] + (int64_t)s * row_bytes[k]
// with the row's bytes exactly as the FTW container stores them (the format's canonical row).
//
// - bank_base[k]: this pool's region in bank k; nullptr (and row_bytes[k] == 0) where the
//   format lacks bank k. Banks come in the FORMAT's bank order (ftw.formats: get_format(name)
//   .bank_names, the order the format's kernel expects), not the model's union order.
// - row_bytes[k]: the slot stride of bank k in bytes. It equals the row's bytes rounded up to
//   a multiple of 16 (so every row starts 16-byte aligned for vector loads); a kernel reads
//   only the row's own bytes, which it knows from H, I and the options.
// - slot_of_expert: num_experts int32 entries (device memory for the GPU pools, host memory
//   for the host twin and the CPU executor), -1 where expert e is not resident. Part of the
//   pool's device-side (layer, expert) -> slot table: a kernel reads it directly, no host
//   remapping. In a prefill pass the same view shape points at the staging region instead
//   (bank_base = staging, slot_of_expert = the staged experts of that pass, -1 elsewhere).
//
// The shape is the one issue 12 fixed; it has not been changed.
#pragma once

#include <cstdint>

namespace ftw {

constexpr int kMaxBanks = 8;

struct PoolLayerView {
    int num_banks;                       // banks of the format, <= kMaxBanks
    const uint8_t* bank_base[kMaxBanks]; // pool region (or staging) in bank k; nullptr if absent
    int64_t row_bytes[kMaxBanks];        // slot stride in bank k; 0 if absent
    const int32_t* slot_of_expert;       // [num_experts], -1 = not resident
    int num_experts;
};

}  // namespace ftw
