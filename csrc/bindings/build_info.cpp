// ftw._runtime.build_info(): what this module was compiled with, so a test (and a user) can see
// that a build did not silently skip CUDA or SIMD.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings/registry.h"
#include "core/format_registry.h"
#ifdef FTW_WITH_CUDA
#include "cuda/info.h"
#endif

namespace nb = nanobind;

namespace {

std::vector<std::string> simd_flags() {
    std::vector<std::string> f;
#ifdef __SSE4_2__
    f.push_back("sse4.2");
#endif
#ifdef __AVX__
    f.push_back("avx");
#endif
#ifdef __AVX2__
    f.push_back("avx2");
#endif
#ifdef __FMA__
    f.push_back("fma");
#endif
#ifdef __F16C__
    f.push_back("f16c");
#endif
#ifdef __AVX512F__
    f.push_back("avx512f");
#endif
#ifdef __AVX512BW__
    f.push_back("avx512bw");
#endif
#ifdef __AVX512BF16__
    f.push_back("avx512bf16");
#endif
#ifdef __ARM_NEON
    f.push_back("neon");
#endif
    return f;
}

}  // namespace

FTW_BINDINGS(build_info) {
    m.def(
        "build_info",
        []() {
            nb::dict d;
            d["version"] = FTW_VERSION;
            d["compiler"] = FTW_CXX_COMPILER;
            d["simd"] = simd_flags();
            d["cpu_formats"] = ftw::cpu::format_names();
#ifdef FTW_WITH_CUDA
            d["cuda"] = true;
            int v = ftw::cuda::runtime_version();
            d["cuda_version"] = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
            d["cuda_compiler"] = FTW_CUDA_COMPILER;
            d["cuda_architectures"] = FTW_CUDA_ARCHITECTURES;
#else
            d["cuda"] = false;
            d["cuda_version"] = nb::none();
            d["cuda_compiler"] = nb::none();
            d["cuda_architectures"] = nb::none();
#endif
            return d;
        },
        "What this module was compiled with: version, compiler, SIMD flags, CPU formats, CUDA.");
    m.def(
        "cuda_device_count",
        []() {
#ifdef FTW_WITH_CUDA
            return ftw::cuda::device_count();
#else
            return 0;
#endif
        },
        "Visible CUDA devices (0 without a GPU, a driver, or a CUDA build).");
}
