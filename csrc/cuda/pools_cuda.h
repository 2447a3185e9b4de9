// The CUDA backend of the slot pools (no CUDA header here: plain .cpp files include it).
#pragma once

#include <memory>

#include "pools/backend.h"

namespace ftw::pools {

// Device buffers on `device`; copies on the backend's own stream (created here), ordered after
// the compute stream set with set_compute_stream (default: the legacy stream).
std::unique_ptr<Backend> make_cuda_backend(int device);

// Rows of at least this many bytes go through cudaMemcpyBatchAsync (copy engines, no SMs);
// smaller rows through one copy-kernel launch (docs/RUNTIME.md, "Copy plan", says why).
constexpr int64_t kBatchCopyMinRow = 256 << 10;

}  // namespace ftw::pools
