// ftw._runtime.ggml_types / ggml_type_info / ggml_to_float / ggml_dot: the ggml type table
// (csrc/formats/gguf/ggml_types.h) seen from Python, for tests and the reference decoders.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings/registry.h"
#include "core/errors.h"
#include "formats/gguf/ggml_types.h"

namespace nb = nanobind;

namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;

bool c_contiguous(const AnyArray& a) {
    int64_t expect = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
        if (a.shape(i) != 1 && a.stride(i) != expect) return false;
        expect *= int64_t(a.shape(i));
    }
    return true;
}

// The bytes of a C-contiguous uint8 array (any shape), refused with `what` named otherwise.
const uint8_t* bytes_of(const AnyArray& a, const char* what) {
    if (a.dtype() != nb::dtype<uint8_t>() || !c_contiguous(a))
        throw ftw::ShapeError(std::string(what) + ": expected a C-contiguous uint8 array of ggml blocks");
    return static_cast<const uint8_t*>(a.data());
}

}  // namespace

FTW_BINDINGS(ggml_types) {
    m.def(
        "ggml_types",
        [] {
            std::vector<std::string> names;
            for (const auto* t : ftw::ggml::all()) names.push_back(t->name);
            return names;
        },
        "Names of the ggml types the runtime decodes, in table order.");

    m.def(
        "ggml_type_info",
        [](const std::string& name) {
            const auto& t = ftw::ggml::lookup(name);
            return std::make_tuple(t.type_id, t.block_values, t.block_bytes);
        },
        nb::arg("type_name"), "(ggml type id, values per block, bytes per block) of a type.");

    m.def(
        "ggml_simd_level", [] { return std::string(ftw::ggml::simd_level()); },
        "Kernels ggml_dot runs here: 'avx2' or 'portable' (FTW_GGML_SIMD=portable forces the latter).");

    m.def(
        "ggml_to_float",
        [](const std::string& name, const AnyArray& data, int64_t n) {
            const auto& t = ftw::ggml::lookup(name);
            const uint8_t* src = bytes_of(data, "ggml_to_float data");
            ftw::ggml::check_row(t, n, int64_t(data.size()), "ggml_to_float data");
            float* out = new float[size_t(n)];
            nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
            {
                nb::gil_scoped_release release;
                t.to_float(src, out, n);
            }
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {size_t(n)}, owner);
        },
        nb::arg("type_name"), nb::arg("data"), nb::arg("n"),
        "n values of ggml blocks (uint8 array of exactly their bytes) -> float32 array, bit-exact to ggml.");

    m.def(
        "ggml_dot",
        [](const std::string& name, const AnyArray& row, const AnyArray& x, bool portable) {
            const auto& t = ftw::ggml::lookup(name);
            const uint8_t* src = bytes_of(row, "ggml_dot row");
            if (x.dtype() != nb::dtype<float>() || x.ndim() != 1 || !c_contiguous(x))
                throw ftw::ShapeError("ggml_dot x: expected a contiguous 1-d float32 array");
            const int64_t n = int64_t(x.shape(0));
            ftw::ggml::check_row(t, n, int64_t(row.size()), "ggml_dot row");
            const float* xp = static_cast<const float*>(x.data());
            nb::gil_scoped_release release;
            return (portable ? t.dot_portable : t.dot)(src, xp, n);
        },
        nb::arg("type_name"), nb::arg("row"), nb::arg("x"), nb::arg("portable") = false,
        "sum_i value(row)[i] * x[i] (float32 accumulation); portable=True forces the scalar kernel.");

    m.def(
        "ggml_matmul",
        [](const std::string& name, const AnyArray& rows, const AnyArray& x) {
            const auto& t = ftw::ggml::lookup(name);
            const uint8_t* src = bytes_of(rows, "ggml_matmul rows");
            if (rows.ndim() != 2)
                throw ftw::ShapeError("ggml_matmul rows: expected a 2-d uint8 array [rows, row bytes]");
            if (x.dtype() != nb::dtype<float>() || x.ndim() != 2 || !c_contiguous(x))
                throw ftw::ShapeError("ggml_matmul x: expected a contiguous 2-d float32 array [tokens, n]");
            const int64_t R = int64_t(rows.shape(0)), rb = int64_t(rows.shape(1));
            const int64_t T = int64_t(x.shape(0)), n = int64_t(x.shape(1));
            ftw::ggml::check_row(t, n, rb, "ggml_matmul rows");
            const float* xp = static_cast<const float*>(x.data());
            float* out = new float[size_t(T * R)];
            nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
            {
                nb::gil_scoped_release release;
                if (T == 1) {
                    t.dot_rows(src, rb, R, xp, n, out);
                } else {
                    std::vector<float> col(static_cast<size_t>(T));
                    for (int64_t r = 0; r < R; ++r) {
                        t.dot_multi(src + r * rb, xp, n, T, n, col.data());
                        for (int64_t i = 0; i < T; ++i) out[i * R + r] = col[size_t(i)];
                    }
                }
            }
            return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, {size_t(T), size_t(R)}, owner);
        },
        nb::arg("type_name"), nb::arg("rows"), nb::arg("x"),
        "x[T, n] @ rows^T -> float32 [T, rows] through dot_rows (T = 1) or dot_multi (one thread).");
}
