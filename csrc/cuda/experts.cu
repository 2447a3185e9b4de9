// Host side of the CUDA experts: the format table, the checks made before any launch, the
// routing kernel that groups a step's pairs by expert, and the streaming-read kernel the bench
// uses as its bandwidth ceiling.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <string>

#include "core/errors.h"
#include "cuda/experts.h"
#include "cuda/experts_kernels.cuh"

namespace ftw::cuda {

namespace {

std::map<std::string, const CudaFormat*>& table() {
    static std::map<std::string, const CudaFormat*> t;  // function-local: ready before registrars run
    return t;
}

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

// Workspace layout: [error, num_tiles] | sorted_pairs [P] | tiles [max_tiles] int4 | act [P, I] bf16
// | at T <= 8 (decode): xq, the tokens' x in integers for phase 0's int8 units (KernelParams::xq: at
// T = 1 H / 32 groups of 64 bytes and a float2 each; at T = 2..8 T H / 32 groups of 64 bytes and a
// float per token and chunk of 256 values, kOptInt8Tokens) | actq, act so for phase 1's (T K I / 32
// groups). Every decode layer has the room (a few KB per token), so that no workspace silently runs
// without the int8 units.
struct Layout {
    int64_t pairs_off, tiles_off, act_off, xq_off, actq_off, total;
};

Layout layout(int T, int K, int I, int E, int H) {
    const int64_t P = int64_t(T) * K;
    Layout l;
    l.pairs_off = 256;
    l.tiles_off = l.pairs_off + align256(P * 4);
    l.act_off = l.tiles_off + align256(int64_t(max_tiles(int(P), 16, E)) * 16);
    l.xq_off = l.act_off + align256(P * I * 2);
    const bool q = T <= 8;
    l.actq_off = l.xq_off + (q ? align256(int64_t(T) * H / 32 * 72) : 0);
    l.total = l.actq_off + (q ? align256(P * I / 32 * 72) : 0);
    return l;
}

std::string bank_where(const std::string& fmt, const BankNeed& n) {
    return fmt + " bank " + std::to_string(n.bank) + " (" + n.name + ")";
}

void check_banks(const CudaFormat& f, const PoolLayerView& v, const KernelParams& kp, int& gu_bias, int& d_bias) {
    BankNeed needs[kMaxBanks];
    const int n = f.needs(kp.H, kp.I, kp, needs);
    if (v.num_banks < 0 || v.num_banks > kMaxBanks)
        throw FormatError("cuda experts: " + std::string(f.name) + " layer view has " + std::to_string(v.num_banks) +
                          " banks (at most " + std::to_string(kMaxBanks) + ")");
    bool present[kMaxBanks] = {};
    for (int i = 0; i < n; ++i) {
        const BankNeed& b = needs[i];
        const bool has = b.bank < v.num_banks && v.bank_base[b.bank] != nullptr && v.row_bytes[b.bank] > 0;
        present[b.bank] = has;
        if (!has) {
            if (b.optional) continue;
            throw FormatError("cuda experts: " + bank_where(f.name, b) + " is missing from the layer view");
        }
        if (v.row_bytes[b.bank] < b.bytes)
            throw FormatError("cuda experts: " + bank_where(f.name, b) + " has rows of " +
                              std::to_string(v.row_bytes[b.bank]) + " bytes, H=" + std::to_string(kp.H) +
                              " I=" + std::to_string(kp.I) + " needs " + std::to_string(b.bytes));
        if (reinterpret_cast<uintptr_t>(v.bank_base[b.bank]) % b.align || v.row_bytes[b.bank] % b.align)
            throw FormatError("cuda experts: " + bank_where(f.name, b) + " base or row stride is not " +
                              std::to_string(b.align) + "-byte aligned");
    }
    gu_bias = f.gu_bias_bank >= 0 && present[f.gu_bias_bank] ? f.gu_bias_bank : -1;
    d_bias = f.down_bias_bank >= 0 && present[f.down_bias_bank] ? f.down_bias_bank : -1;
    if ((gu_bias < 0) != (d_bias < 0))
        throw FormatError("cuda experts: " + std::string(f.name) + " layer has one expert bias bank without the other");
}

// ---- routing kernel -----------------------------------------------------------------------

constexpr int kRouteThreads = 1024;
constexpr int kMaxExperts = 3072;  // three int tables of E entries in shared memory (36 KiB)

// Exclusive block-wide scan of (pairs, tiles) per thread; returns the block totals.
__device__ int2 block_scan(int2 v, int2* warp_sums, int2& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int2 incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, incl.x, d), b = __shfl_up_sync(0xffffffffu, incl.y, d);
        if (lane >= d) incl.x += a, incl.y += b;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        int2 s = lane < nw ? warp_sums[lane] : make_int2(0, 0);
        int2 si = s;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, si.x, d), b = __shfl_up_sync(0xffffffffu, si.y, d);
            if (lane >= d) si.x += a, si.y += b;
        }
        if (lane < nw) warp_sums[lane] = make_int2(si.x - s.x, si.y - s.y);  // exclusive warp offsets
        if (lane == 31) warp_sums[32] = si;
    }
    __syncthreads();
    total = warp_sums[32];
    const int2 off = warp_sums[warp];
    return make_int2(off.x + incl.x - v.x, off.y + incl.y - v.y);
}

__global__ void __launch_bounds__(kRouteThreads) experts_route(const KernelParams p, int tile_m) {
    extern __shared__ int sh[];
    __shared__ int2 warp_sums[33];
    __shared__ int first_bad;
    const int E = p.num_experts, P = p.T * p.K;
    int* cnt = sh;
    int* poff = sh + E;
    int* toff = sh + 2 * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    if (threadIdx.x == 0) first_bad = INT_MAX;
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int e = p.topk_ids[i];
        const int s = (e >= 0 && e < E) ? p.slot_of_expert[e] : -1;
        if (s < 0 || s >= p.num_slots)
            atomicMin(&first_bad, i);
        else
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    // each thread scans a contiguous run of experts
    const int per = (E + blockDim.x - 1) / blockDim.x;
    const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
    int2 local = make_int2(0, 0);
    for (int e = e0; e < e1; ++e) local.x += cnt[e], local.y += (cnt[e] + tile_m - 1) / tile_m;
    int2 total;
    int2 run = block_scan(local, warp_sums, total);
    for (int e = e0; e < e1; ++e) {
        poff[e] = run.x, toff[e] = run.y;
        run.x += cnt[e], run.y += (cnt[e] + tile_m - 1) / tile_m;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int n = cnt[e];
        if (n == 0) continue;
        const int slot = p.slot_of_expert[e];
        for (int t = 0; t * tile_m < n; ++t)
            p.tiles[toff[e] + t] = make_int4(slot, poff[e] + t * tile_m, min(tile_m, n - t * tile_m), e);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;  // now the fill cursors
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int e = p.topk_ids[i];
        const int s = (e >= 0 && e < E) ? p.slot_of_expert[e] : -1;
        if (s < 0 || s >= p.num_slots) continue;
        p.sorted_pairs[poff[e] + atomicAdd(&cnt[e], 1)] = i;
    }
    if (threadIdx.x == 0) {
        *p.num_tiles = total.y;
        *p.error = first_bad == INT_MAX ? 0 : first_bad + 1;
    }
}

__global__ void stream_read_kernel(const uint4* __restrict__ src, int64_t n, uint32_t* sink) {
    uint32_t acc = 0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const uint4 v = ld_stream(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(sink + (blockIdx.x & 1023), acc);
}

}  // namespace

CudaFormatRegistrar::CudaFormatRegistrar(const CudaFormat* f) { table().emplace(f->name, f); }

int max_tiles(int pairs, int tile_m, int num_experts) {
    return (pairs + tile_m - 1) / tile_m + std::min(num_experts, pairs);
}

void check_launch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw CudaError(std::string("CUDA error launching the experts ") + what + ": " + cudaGetErrorString(e));
}

void launch_route(const KernelParams& p, int tile_m, cudaStream_t stream) {
    const cudaError_t e = cudaMemsetAsync(p.out, 0, size_t(p.T) * p.H * sizeof(float), stream);
    if (e != cudaSuccess) throw CudaError(std::string("CUDA error clearing the experts output: ") + cudaGetErrorString(e));
    experts_route<<<1, kRouteThreads, 3 * p.num_experts * sizeof(int), stream>>>(p, tile_m);
    check_launch("routing kernel");
}

int64_t workspace_bytes(int T, int K, int I, int num_experts, int H) { return layout(T, K, I, num_experts, H).total; }

int decode_ksplit(int in, int vec, int blocks, int sms) { return k_split(in, vec, blocks, sms); }

uintptr_t error_flag(uintptr_t workspace) { return workspace; }

std::vector<std::string> experts_formats() {
    std::vector<std::string> names;
    for (auto& [name, f] : table()) names.push_back(name);
    return names;
}

void experts_forward(const std::string& format, const PoolLayerView& view, const ExpertsProblem& p,
                     const ActivationSpec& act, const FormatOptions& opt, uintptr_t stream) {
    auto it = table().find(format);
    if (it == table().end()) {
        std::string known;
        for (auto& name : experts_formats()) known += (known.empty() ? "" : ", ") + name;
        throw UnsupportedError("cuda experts: no CUDA kernel for layer format '" + format + "' (CUDA formats: " + known +
                               "); run the layer on the CPU executor");
    }
    const CudaFormat& f = *it->second;
    const std::string where = "cuda experts (" + format + "): ";
    if (p.H <= 0 || p.I <= 0 || p.T <= 0 || p.K <= 0)
        throw ShapeError(where + "H, I, T and top_k must be positive (H=" + std::to_string(p.H) + ", I=" +
                         std::to_string(p.I) + ", T=" + std::to_string(p.T) + ", K=" + std::to_string(p.K) + ")");
    if (p.H % f.vec || p.I % f.vec)
        throw UnsupportedError(where + "the kernel reads 16-byte units of " + std::to_string(f.vec) +
                               " values: H and I must be multiples of " + std::to_string(f.vec) + " (H=" +
                               std::to_string(p.H) + ", I=" + std::to_string(p.I) + ")");
    if (view.num_experts <= 0 || view.num_experts > kMaxExperts)
        throw UnsupportedError(where + "num_experts must be in 1.." + std::to_string(kMaxExperts) + ", got " +
                               std::to_string(view.num_experts));
    if (p.num_slots <= 0) throw ShapeError(where + "the pool has no slots");
    if (view.slot_of_expert == nullptr) throw ShapeError(where + "slot_of_expert is null");
    if (int64_t(p.T) * p.K > int64_t(1) << 24) throw ShapeError(where + "T * top_k is too large for one step");
    if (!p.x || !p.topk_ids || !p.topk_weights || !p.out || !p.workspace)
        throw ShapeError(where + "x, topk_ids, topk_weights, out and workspace must be device pointers");
    if (p.x % 16) throw ShapeError(where + "x must be 16-byte aligned");
    if (p.workspace % 256) throw ShapeError(where + "the workspace must be 256-byte aligned");
    const int pairs = p.T * p.K;
    if ((p.T > 8 || pairs > kDecodeMaxPairs) && max_tiles(pairs, 64, view.num_experts) > 65535)
        throw ShapeError(where + "T * top_k = " + std::to_string(pairs) + " pairs is more than one launch covers "
                         "(about 4 million); split the step");
    const Layout l = layout(p.T, p.K, p.I, view.num_experts, p.H);
    if (p.workspace_bytes < l.total)
        throw ShapeError(where + "workspace of " + std::to_string(p.workspace_bytes) + " bytes, needs " +
                         std::to_string(l.total));

    KernelParams kp{};
    for (int k = 0; k < kMaxBanks; ++k) {
        kp.bank[k] = k < view.num_banks ? view.bank_base[k] : nullptr;
        kp.row_bytes[k] = k < view.num_banks ? view.row_bytes[k] : 0;
    }
    kp.slot_of_expert = view.slot_of_expert;
    kp.num_experts = view.num_experts;
    kp.num_slots = p.num_slots;
    kp.H = p.H, kp.I = p.I, kp.T = p.T, kp.K = p.K;
    kp.x = reinterpret_cast<const __nv_bfloat16*>(p.x);
    kp.topk_ids = reinterpret_cast<const int32_t*>(p.topk_ids);
    kp.topk_weights = reinterpret_cast<const float*>(p.topk_weights);
    kp.out = reinterpret_cast<float*>(p.out);
    auto* ws = reinterpret_cast<uint8_t*>(p.workspace);
    kp.error = reinterpret_cast<int32_t*>(ws);
    kp.num_tiles = reinterpret_cast<int32_t*>(ws + 4);
    kp.sorted_pairs = reinterpret_cast<int32_t*>(ws + l.pairs_off);
    kp.tiles = reinterpret_cast<int4*>(ws + l.tiles_off);
    kp.act = reinterpret_cast<__nv_bfloat16*>(ws + l.act_off);
    // the int8 x and act (T <= 8; null otherwise: no kernel reads them then)
    kp.xq = p.T <= 8 ? ws + l.xq_off : nullptr;
    kp.actq = p.T <= 8 ? ws + l.actq_off : nullptr;

    if (act.kind != ActKind::Silu && act.kind != ActKind::SwigluOai)
        throw UnsupportedError(where + "unknown activation kind " + std::to_string(int(act.kind)));
    if (act.kind == ActKind::SwigluOai && !(std::isfinite(act.alpha) && act.alpha > 0))
        throw FormatError(where + "swiglu_oai needs a finite positive alpha");
    kp.act_kind = int(act.kind);
    kp.alpha = act.alpha;
    kp.limit = (act.limit > 0 && std::isfinite(act.limit)) ? act.limit : INFINITY;

    if (opt.bias_dtype != "bf16" && opt.bias_dtype != "f32")
        throw UnsupportedError(where + "expert biases must be bf16 or f32, got " + opt.bias_dtype);
    kp.bias_f32 = opt.bias_dtype == "f32";
    kp.block_out = opt.block_out, kp.block_in = opt.block_in, kp.scale_f32 = 1;
    for (int i = 0; i < 3; ++i) kp.ggml_type[i] = opt.ggml_types[i];
    if (f.uses_fp8_block_options) {
        if (opt.block_out <= 0 || opt.block_in <= 0)
            throw FormatError(where + "block_size must be two positive integers");
        // one scale per 64-value chunk (4 lanes x 16 bytes): a chunk must not straddle input blocks
        const int chunk = 4 * f.vec;
        for (int in : {p.H, p.I})
            if (opt.block_in % chunk != 0 && opt.block_in < in)
                throw UnsupportedError(where + "block_size[1]=" + std::to_string(opt.block_in) +
                                       " must be a multiple of " + std::to_string(chunk) + " (or cover the whole row)");
        if (opt.scale_dtype != "f32" && opt.scale_dtype != "bf16")
            throw UnsupportedError(where + "block scales must be f32 or bf16, got " + opt.scale_dtype);
        kp.scale_f32 = opt.scale_dtype == "f32";
    }
    int gu_bias = -1, d_bias = -1;
    check_banks(f, view, kp, gu_bias, d_bias);
    kp.gu_bias_bank = gu_bias, kp.down_bias_bank = d_bias;

    f.launch(kp, reinterpret_cast<cudaStream_t>(stream));
}

void stream_read(uintptr_t ptr, int64_t bytes, uintptr_t sink, uintptr_t stream) {
    if (ptr % 16 || bytes % 16) throw ShapeError("stream_read: pointer and size must be multiples of 16");
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    stream_read_kernel<<<sms * 4, 512, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const uint4*>(ptr), bytes / 16, reinterpret_cast<uint32_t*>(sink));
    check_launch("streaming read");
}

}  // namespace ftw::cuda
