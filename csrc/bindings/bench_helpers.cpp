// Helpers for bench/: the machine's read bandwidth measured the way the executor reads (the
// same thread pool, the same number of threads), so a bench can print weight bytes per second
// as a fraction of what this machine can read at all.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <atomic>
#include <cstring>

#include "bindings/registry.h"
#include "core/thread_pool.h"

namespace nb = nanobind;

FTW_BINDINGS(bench_helpers) {
    m.def(
        "_read_sum",
        [](nb::ndarray<nb::device::cpu> buf, int threads, int repeats) {
            const uint8_t* p = static_cast<const uint8_t*>(buf.data());
            const int64_t n = int64_t(buf.nbytes()) / 64 * 64;
            constexpr int64_t kChunk = int64_t(1) << 20;
            std::atomic<uint64_t> total{0};
            {
                nb::gil_scoped_release release;
                ftw::ThreadPool pool(threads);
                for (int r = 0; r < repeats; ++r)
                    pool.parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
                        const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
                        uint64_t acc[8] = {};
                        for (int64_t i = lo; i < hi; i += 64)
                            for (int j = 0; j < 8; ++j) {
                                uint64_t v;
                                std::memcpy(&v, p + i + 8 * j, 8);
                                acc[j] += v;
                            }
                        uint64_t s = 0;
                        for (uint64_t v : acc) s += v;
                        total.fetch_add(s, std::memory_order_relaxed);
                    });
            }
            return total.load();
        },
        nb::arg("buffer"), nb::arg("threads"), nb::arg("repeats") = 1,
        "Sum of a buffer's 64-bit words over `threads` threads, `repeats` times (a read-bandwidth probe).");
}
