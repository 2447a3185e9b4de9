// ggml's block types, one registered entry per type: sizes, a row decoder and a row dot product.
//
// The CPU executor (and later the CUDA kernels, through the same generated tables) reads GGUF
// expert rows as the file stores them and looks each layer's type up here; nothing else in
// csrc/ knows a ggml block layout. The decoders are bit-exact to ggml's dequantize_row_* (and to
// gguf.quants, which mirrors them); tables such as the IQ grids are generated from the gguf
// package at build time (gen_tables.py), never typed by hand. CUDA code gets the same tables by
// including the generated "ggml_tables.h" after `#define FTW_GGML_TABLE static __constant__ const`.
//
// Every dot prefetches the row 4 KiB ahead of the block it decodes: from DRAM, without it, the
// kernels ran at half their in-cache rate (docs/BENCHMARKS.md, "ggml row dot products").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ftw::ggml {

struct TypeTraits {
    const char* name;   // the gguf name, e.g. "Q4_K" (GGMLQuantizationType.name)
    int type_id;        // ggml type id, e.g. 12
    int block_values;   // values per block (1 for F32/F16/BF16)
    int block_bytes;    // bytes per block
    // n values (a multiple of block_values) of a row -> float32, bit-exact to ggml
    void (*to_float)(const uint8_t* src, float* dst, int64_t n);
    // sum_i value(row)[i] * x[i] over n values, float32 accumulation; blocks are dequantized in
    // registers one at a time. The AVX2 kernel where the CPU has AVX2, else the portable one.
    float (*dot)(const uint8_t* row, const float* x, int64_t n);
    // the portable C++ dot, always compiled; `dot` is this where no SIMD kernel applies
    float (*dot_portable)(const uint8_t* row, const float* x, int64_t n);
    // out[t] = dot(row, x + t * ldx, n) for t < m (prefill: one weight row times the m tokens
    // routed to its expert). Decodes each block once for several tokens where that is faster
    // than m calls of `dot` (256-value blocks from 8 tokens on); float32 accumulation as `dot`.
    void (*dot_multi)(const uint8_t* row, const float* x, int64_t ldx, int64_t m, int64_t n, float* out);
    // out[r] = dot(rows + r * stride, x, n) for r < R (decode: one token against R rows of a
    // projection). Work that depends only on x is done once for all rows (Q2_K/Q4_K/Q5_K: the
    // sums of x that their mins multiply, ~1.15-1.25x over R calls of `dot`).
    void (*dot_rows)(const uint8_t* rows, int64_t stride, int64_t R, const float* x, int64_t n, float* out);

    int64_t row_bytes(int64_t n) const { return n / block_values * block_bytes; }
};

// nullptr when the type is not in the table
const TypeTraits* find(std::string_view name);
const TypeTraits* find(int type_id);
// every type, in table order
std::vector<const TypeTraits*> all();

// Like find, but an unknown type throws ftw::UnsupportedError naming it and the known types.
const TypeTraits& lookup(std::string_view name);

// Throws ftw::FormatError unless n values of `t` fill exactly `nbytes` bytes (n a multiple of
// the block size); `what` names the row in the message.
void check_row(const TypeTraits& t, int64_t n, int64_t nbytes, std::string_view what);

// The kernels `dot` runs in this process: "avx2" (found at run time) or "portable" (no AVX2, or
// the environment variable FTW_GGML_SIMD=portable).
const char* simd_level();

}  // namespace ftw::ggml
