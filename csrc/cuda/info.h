// What the CUDA runtime linked into the module says (only in builds with CUDA).
#pragma once

namespace ftw::cuda {

int runtime_version();  // CUDART_VERSION this module was compiled against, e.g. 13000
int device_count();     // visible devices; 0 where there is no GPU or driver (never throws)

}  // namespace ftw::cuda
