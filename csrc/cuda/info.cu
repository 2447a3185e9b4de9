#include <cuda_runtime.h>

#include "cuda/info.h"

namespace ftw::cuda {

int runtime_version() { return CUDART_VERSION; }

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device / no driver" error
        return 0;
    }
    return n;
}

}  // namespace ftw::cuda
