// Where the slot pools keep their device buffers and how a batch of copies runs. Two
// implementations: the host twin (host_backend.cpp: "device" buffers in host memory, copies
// by memcpy, so CI drives the same planner, LRU, staging and copy plan through real bytes)
// and CUDA (csrc/cuda/pools_cuda.cu: one cudaMemcpyBatchAsync and/or one copy kernel on the
// pools' own stream).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ftw::pools {

struct CopyOp {
    const void* src;  // host bytes, as the backend's source() returned them
    void* dst;        // device bytes
    int64_t bytes;    // > 0: a bank the format lacks never makes an op
};

// Every copy of one step (all misses, across all banks and pools, plus the slot-table rows
// they changed): the backend runs it as one operation.
struct CopyBatch {
    std::vector<CopyOp> ops;
    int64_t bytes = 0;
    void add(const void* src, void* dst, int64_t n) {
        ops.push_back({src, dst, n});
        bytes += n;
    }
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // Zeroed device memory that lives as long as the backend.
    virtual uint8_t* alloc(int64_t bytes) = 0;
    // The address a copy reads host bytes [host, host + bytes) from (the CUDA backend needs
    // page-locked memory and returns its device alias). Throws naming `what` if unusable.
    virtual const void* source(const void* host, int64_t bytes, const std::string& what) = 0;
    // Host scratch for this batch's table rows, safe to write until the next upload() call
    // after the following submit (the backend waits for the batch before last, if needed).
    virtual uint8_t* upload(int64_t bytes) = 0;
    // Channels order copies against compute: 0 = the cache slots (decode), 1 and 2 = the two
    // staging halves. A batch on channel 0 starts after everything already queued on the
    // compute stream (the previous layer's kernel may still read a slot being refilled); a
    // batch on a staging half waits only for the compute released on that half, so one half
    // fills while the other one's group computes.
    virtual void submit(const CopyBatch& batch, int channel) = 0;
    // Makes the compute stream wait for the last batch submitted on `channel`.
    virtual void join(int channel) = 0;
    // Marks the compute queued so far as the last reader of `channel` (a staging half).
    virtual void release(int channel) {}
    // Waits for every submitted batch (host side).
    virtual void sync() = 0;
    // Copies device bytes back to the host (tests and checks).
    virtual void read(void* dst, const void* device_src, int64_t bytes) = 0;
    // The stream compute runs on (a cudaStream_t as an integer; 0 = the legacy stream).
    virtual void set_compute_stream(int64_t stream) {}
    // Rows of at least this many bytes take the copy engines, smaller ones the copy kernel
    // (CUDA only; the bench sets it to measure both mechanisms at every row size).
    virtual void set_batch_min_row(int64_t bytes) {}
    // Device time of the last batch in ms, from its first copy to its last (CUDA, with timing
    // switched on: two event records per batch, so off by default); -1 where not measured.
    virtual void set_timing(bool on) {}
    virtual double last_copy_ms() { return -1.0; }
    // What the last submit used, for tests and the bench: ops by mechanism.
    int64_t last_batch_calls = 0;   // cudaMemcpyBatchAsync calls (host: memcpy batches)
    int64_t last_kernel_calls = 0;  // copy-kernel launches
    int64_t batch_call_failures = 0;  // batches whose cudaMemcpyBatchAsync the driver refused
};

std::unique_ptr<Backend> make_host_backend();

}  // namespace ftw::pools
