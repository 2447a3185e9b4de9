// The CUDA backend of the slot pools: one batch of copies per step, on the pools' own stream.
//
// A batch is split by row size (docs/RUNTIME.md): rows >= kBatchCopyMinRow go to one
// cudaMemcpyBatchAsync call (copy engines: ~50 GB/s at 256 KiB, ~54 at MiB rows on the H200,
// no SMs taken from compute); smaller rows to one launch of a copy kernel that reads pinned
// host memory (~51 GB/s down to 16 KiB rows, where the batch call falls to 33 and 21). Table
// rows (E * 4 bytes) always ride in the kernel. No loop of cudaMemcpyAsync anywhere.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/errors.h"
#include "cuda/pools_cuda.h"

namespace ftw::pools {
namespace {

void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) {
        cudaGetLastError();
        throw CudaError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(rc));
    }
}

struct KernelOp {
    const uint8_t* src;
    uint8_t* dst;
    int64_t bytes;
};

// One block per op at a time (ops strided over blocks); 16-byte accesses where the op allows.
__global__ void copy_rows_kernel(const KernelOp* ops, int n) {
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const KernelOp op = ops[i];
        const bool wide = ((reinterpret_cast<uintptr_t>(op.src) | reinterpret_cast<uintptr_t>(op.dst) |
                            static_cast<uintptr_t>(op.bytes)) & 15) == 0;
        if (wide) {
            // four 16-byte loads in flight per thread before their stores: reads of pinned host
            // memory cross PCIe with microseconds of latency, so parallelism sets the bandwidth
            const int4* __restrict__ s = reinterpret_cast<const int4*>(op.src);
            int4* __restrict__ d = reinterpret_cast<int4*>(op.dst);
            const int64_t n16 = op.bytes / 16, step = blockDim.x;
            int64_t j = threadIdx.x;
            for (; j + 3 * step < n16; j += 4 * step) {
                const int4 a = s[j], b = s[j + step], c = s[j + 2 * step], e = s[j + 3 * step];
                d[j] = a, d[j + step] = b, d[j + 2 * step] = c, d[j + 3 * step] = e;
            }
            for (; j < n16; j += step) d[j] = s[j];
        } else {
            for (int64_t j = threadIdx.x; j < op.bytes; j += blockDim.x) op.dst[j] = op.src[j];
        }
    }
}

constexpr int kCopyBlocks = 16;    // the measured 51 GB/s needed only 16 x 512 (DESIGN.md)
constexpr int kCopyThreads = 512;

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int device) : device_(device) {
        check(cudaSetDevice(device_), "cudaSetDevice");
        check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
        for (auto& e : done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
        for (int c = 0; c < kChannels; ++c) {
            check(cudaEventCreateWithFlags(&copied_[c], cudaEventDisableTiming), "cudaEventCreate");
            check(cudaEventCreateWithFlags(&release_[c], cudaEventDisableTiming), "cudaEventCreate");
        }
    }
    ~CudaBackend() override {
        cudaSetDevice(device_);
        cudaStreamSynchronize(copy_);
        for (void* p : buffers_) cudaFree(p);
        for (auto& u : scratch_) {
            if (u.table.ptr) cudaFreeHost(u.table.ptr);
            if (u.ops.ptr) cudaFreeHost(u.ops.ptr);
        }
        for (auto& e : done_) cudaEventDestroy(e);
        cudaEventDestroy(ready_);
        if (t0_) cudaEventDestroy(t0_), cudaEventDestroy(t1_);
        for (int c = 0; c < kChannels; ++c) cudaEventDestroy(copied_[c]), cudaEventDestroy(release_[c]);
        cudaStreamDestroy(copy_);
    }
    std::string name() const override { return "cuda"; }

    uint8_t* alloc(int64_t bytes) override {
        check(cudaSetDevice(device_), "cudaSetDevice");
        void* p = nullptr;
        check(cudaMalloc(&p, bytes ? bytes : 256), "cudaMalloc");
        check(cudaMemset(p, 0, bytes ? bytes : 256), "cudaMemset");
        buffers_.push_back(p);
        return static_cast<uint8_t*>(p);
    }

    const void* source(const void* host, int64_t bytes, const std::string& what) override {
        // the copy kernel reads host rows in place: the memory must be page-locked
        // (ftw.load_expert_banks(pin=True) registers it; torch's pin_memory allocates it), and
        // its device alias must be the host address (true on x86-64 and Grace with UVA), so one
        // pointer serves both the batch call and the kernel
        cudaPointerAttributes a{};
        if (cudaPointerGetAttributes(&a, host) != cudaSuccess || a.type != cudaMemoryTypeHost) {
            cudaGetLastError();
            throw FormatError("pools: " + what + " is not page-locked host memory; load the banks with pin=True");
        }
        // cudaHostRegister'd memory (the loader's) is reachable at its host address where the
        // device says so; cudaHostAlloc'd memory is mapped at it under UVA
        int same = 0;
        cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, device_);
        if (a.devicePointer != host && !same)
            throw UnsupportedError("pools: " + what + ": this device maps page-locked memory at another address");
        return host;
    }

    uint8_t* upload(int64_t bytes) override {
        // two pinned scratch buffers, one per batch in flight: before refilling one, wait for
        // the batch that last read it
        Scratch& u = wait_for(next_);
        reserve(u.table, bytes);
        return u.table.ptr;
    }

    void set_batch_min_row(int64_t bytes) override { batch_min_row_ = bytes; }
    void set_timing(bool on) override {
        if (on && !t0_) {
            check(cudaEventCreate(&t0_), "cudaEventCreate");
            check(cudaEventCreate(&t1_), "cudaEventCreate");
        }
        timing_ = on;
    }
    double last_copy_ms() override {
        if (!timed_) return -1.0;
        float ms = 0;
        check(cudaEventSynchronize(t1_), "cudaEventSynchronize");
        check(cudaEventElapsedTime(&ms, t0_, t1_), "cudaEventElapsedTime");
        return ms;
    }
    void set_compute_stream(int64_t stream) override { compute_ = reinterpret_cast<cudaStream_t>(stream); }

    void submit(const CopyBatch& batch, int channel) override {
        check(cudaSetDevice(device_), "cudaSetDevice");
        last_batch_calls = last_kernel_calls = 0;
        timed_ = false;
        if (batch.ops.empty()) return;
        if (channel == 0) {
            // after everything already queued on compute: the previous layer's kernel may
            // still read a slot being refilled
            check(cudaEventRecord(ready_, compute_), "cudaEventRecord");
            check(cudaStreamWaitEvent(copy_, ready_, 0), "cudaStreamWaitEvent");
        } else if (released_[channel]) {
            // a staging half: after the compute that last read it
            check(cudaStreamWaitEvent(copy_, release_[channel], 0), "cudaStreamWaitEvent");
        }

        std::vector<void*> dsts;
        std::vector<const void*> srcs;
        std::vector<size_t> sizes;
        std::vector<KernelOp> small;
        for (const auto& op : batch.ops) {
            if (op.bytes >= batch_min_row_) {
                dsts.push_back(op.dst);
                srcs.push_back(op.src);
                sizes.push_back(static_cast<size_t>(op.bytes));
            } else {
                small.push_back({static_cast<const uint8_t*>(op.src), static_cast<uint8_t*>(op.dst), op.bytes});
            }
        }
        const int i = next_;
        if (timing_) check(cudaEventRecord(t0_, copy_), "cudaEventRecord");
        if (!dsts.empty()) {
            cudaMemcpyAttributes attr{};
            attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
            size_t attr_idx = 0;
            const cudaError_t rc = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                                                        &attr_idx, 1, copy_);
            if (rc == cudaSuccess) {
                ++last_batch_calls;
            } else {
                // a driver that refuses the batch call: the kernel takes those rows too (the
                // bench reports batch_call_failures), never a loop of cudaMemcpyAsync
                cudaGetLastError();
                ++batch_call_failures;
                for (size_t j = 0; j < dsts.size(); ++j)
                    small.push_back({static_cast<const uint8_t*>(srcs[j]), static_cast<uint8_t*>(dsts[j]),
                                     static_cast<int64_t>(sizes[j])});
            }
        }
        if (!small.empty()) {
            // the op list goes into this batch's pinned scratch; the kernel reads it in place
            Scratch& u = wait_for(i);
            reserve(u.ops, static_cast<int64_t>(small.size() * sizeof(KernelOp)));
            std::memcpy(u.ops.ptr, small.data(), small.size() * sizeof(KernelOp));
            const int blocks = static_cast<int>(std::min<size_t>(small.size(), kCopyBlocks));
            copy_rows_kernel<<<blocks, kCopyThreads, 0, copy_>>>(reinterpret_cast<const KernelOp*>(u.ops.ptr),
                                                                  static_cast<int>(small.size()));
            check(cudaGetLastError(), "copy kernel launch");
            ++last_kernel_calls;
        }
        if (timing_) check(cudaEventRecord(t1_, copy_), "cudaEventRecord");
        timed_ = timing_;
        check(cudaEventRecord(done_[i], copy_), "cudaEventRecord");
        check(cudaEventRecord(copied_[channel], copy_), "cudaEventRecord");
        copied_set_[channel] = true;
        scratch_[i].used = true;
        next_ = 1 - i;
    }

    void join(int channel) override {
        if (copied_set_[channel]) check(cudaStreamWaitEvent(compute_, copied_[channel], 0), "cudaStreamWaitEvent");
    }
    void release(int channel) override {
        check(cudaEventRecord(release_[channel], compute_), "cudaEventRecord");
        released_[channel] = true;
    }
    void sync() override { check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize"); }
    void read(void* dst, const void* src, int64_t bytes) override {
        check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), "cudaMemcpy");
    }

private:
    struct Buffer {
        uint8_t* ptr = nullptr;
        int64_t cap = 0;
    };
    struct Scratch {
        Buffer table, ops;
        bool used = false;  // a submitted batch may still read it
    };
    Scratch& wait_for(int i) {
        Scratch& u = scratch_[i];
        if (u.used) check(cudaEventSynchronize(done_[i]), "cudaEventSynchronize");
        u.used = false;
        return u;
    }
    static void reserve(Buffer& b, int64_t bytes) {
        if (b.cap >= bytes) return;
        if (b.ptr) check(cudaFreeHost(b.ptr), "cudaFreeHost");
        b.ptr = nullptr;
        b.cap = std::max<int64_t>(bytes * 2, 64 << 10);
        check(cudaHostAlloc(reinterpret_cast<void**>(&b.ptr), b.cap, cudaHostAllocMapped), "cudaHostAlloc");
    }

    int device_;
    int64_t batch_min_row_ = kBatchCopyMinRow;
    bool timing_ = false, timed_ = false;
    cudaEvent_t t0_ = nullptr, t1_ = nullptr;  // around a batch's copies, when timing
    cudaStream_t copy_ = nullptr;
    cudaStream_t compute_ = nullptr;
    cudaEvent_t done_[2]{};
    cudaEvent_t ready_ = nullptr;
    static constexpr int kChannels = 3;
    cudaEvent_t copied_[kChannels]{}, release_[kChannels]{};
    bool copied_set_[kChannels]{}, released_[kChannels]{};
    Scratch scratch_[2];
    int next_ = 0;
    std::vector<void*> buffers_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace ftw::pools
