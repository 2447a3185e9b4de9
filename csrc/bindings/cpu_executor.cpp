// ftw._runtime.CpuExecutor: the CPU MoE executor (csrc/core/moe_executor.*) over arrays that
// cross as nanobind ndarrays (numpy or torch, DLPack, zero copy). The public API with the
// checks against the format registry is ftw.runtime.CpuMoeExecutor (ftw/runtime/cpu.py); this
// file validates every array it is handed anyway, so no call can read out of bounds.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "bindings/registry.h"
#include "core/format_registry.h"
#include "core/moe_executor.h"

namespace nb = nanobind;
using Array = nb::ndarray<nb::device::cpu>;

namespace {

using ftw::ShapeError;
namespace cpu = ftw::cpu;

std::string describe(const Array& a) {
    const auto d = a.dtype();
    std::ostringstream s;
    switch (d.code) {
        case uint8_t(nb::dlpack::dtype_code::Int): s << "int"; break;
        case uint8_t(nb::dlpack::dtype_code::UInt): s << "uint"; break;
        case uint8_t(nb::dlpack::dtype_code::Float): s << "float"; break;
        case uint8_t(nb::dlpack::dtype_code::Bfloat): s << "bfloat"; break;
        default: s << "dtype" << int(d.code) << "_";
    }
    s << int(d.bits) << " [";
    for (size_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    s << "]";
    return s.str();
}

bool is(const Array& a, nb::dlpack::dtype_code code, int bits) {
    return a.dtype().code == uint8_t(code) && a.dtype().bits == bits && a.dtype().lanes == 1;
}

bool c_contiguous(const Array& a) {
    int64_t want = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
        if (a.shape(i) != 1 && a.stride(i) != want) return false;
        want *= int64_t(a.shape(i));
    }
    return true;
}

// bf16 hidden states: torch.bfloat16, or numpy uint16 holding bf16 bit patterns
bool is_bf16(const Array& a) {
    return is(a, nb::dlpack::dtype_code::Bfloat, 16) || is(a, nb::dlpack::dtype_code::UInt, 16);
}

class PyCpuExecutor {
public:
    explicit PyCpuExecutor(int threads) : ex_(threads) {}

    int threads() const { return ex_.threads(); }

    int add_format(const std::string& name, const std::map<std::string, std::string>& options) {
        return ex_.add_format(name, options);
    }

    // banks: name -> (array [E, *row], ftw dtype name); an array with no bytes is "absent"
    void add_layer(int64_t layer, int format, int64_t E, int64_t H, int64_t I,
                   const std::map<std::string, std::pair<Array, std::string>>& banks, const std::string& act_kind,
                   double limit, double alpha) {
        const std::string where = "layer " + std::to_string(layer);
        cpu::LayerBanks lb;
        lb.E = E, lb.H = H, lb.I = I;
        for (const auto& [name, item] : banks) {
            const Array& a = item.first;
            cpu::Bank b;
            b.dtype = cpu::parse_dtype(item.second);
            if (a.size() == 0) {
                lb.banks[name] = b;  // placeholder: not present
                continue;
            }
            if (a.ndim() < 1 || int64_t(a.shape(0)) != E)
                throw ftw::FormatError(where + ": bank '" + name + "' must be [E=" + std::to_string(E) + ", ...], got " + describe(a));
            if (!c_contiguous(a))
                throw ftw::FormatError(where + ": bank '" + name + "' must be C-contiguous");
            if (int(a.dtype().bits) != 8 * cpu::dtype_size(b.dtype))
                throw ftw::FormatError(where + ": bank '" + name + "' is " + describe(a) + ", not " +
                                       std::to_string(8 * cpu::dtype_size(b.dtype)) + "-bit " + item.second);
            b.data = static_cast<const uint8_t*>(a.data());
            b.expert_bytes = int64_t(a.nbytes()) / E;
            b.expert_stride = b.expert_bytes;
            b.present = true;
            lb.banks[name] = b;
            keep_.push_back(a);
        }
        ex_.add_layer(layer, format, std::move(lb), ftw::Activation::make(act_kind, limit, alpha));
    }

    void forward(int64_t layer, const Array& hidden, const Array& ids, const Array& weights, Array& out) {
        const cpu::LayerBanks& L = ex_.layer_banks(layer);
        const int64_t H = L.H, E = L.E;
        const std::string where = "layer " + std::to_string(layer) + ": ";
        const bool bf16 = is_bf16(hidden);
        if (hidden.ndim() != 2 || int64_t(hidden.shape(1)) != H || hidden.shape(0) == 0 ||
            !(bf16 || is(hidden, nb::dlpack::dtype_code::Float, 32)))
            throw ShapeError(where + "hidden must be [T, H=" + std::to_string(H) +
                             "] float32 or bf16 (torch.bfloat16, or numpy uint16 bf16 bits), T >= 1; got " + describe(hidden));
        const int64_t T = int64_t(hidden.shape(0));
        const bool ids64 = is(ids, nb::dlpack::dtype_code::Int, 64);
        if (ids.ndim() != 2 || int64_t(ids.shape(0)) != T || ids.shape(1) == 0 ||
            !(ids64 || is(ids, nb::dlpack::dtype_code::Int, 32)))
            throw ShapeError(where + "topk_ids must be [T=" + std::to_string(T) + ", k] int32 or int64, k >= 1; got " + describe(ids));
        const int64_t k = int64_t(ids.shape(1));
        if (weights.ndim() != 2 || int64_t(weights.shape(0)) != T || int64_t(weights.shape(1)) != k ||
            !is(weights, nb::dlpack::dtype_code::Float, 32))
            throw ShapeError(where + "topk_weights must be [T=" + std::to_string(T) + ", k=" + std::to_string(k) +
                             "] float32; got " + describe(weights));
        if (out.ndim() != 2 || int64_t(out.shape(0)) != T || int64_t(out.shape(1)) != H ||
            out.dtype() != hidden.dtype())
            throw ShapeError(where + "out must be [T, H] of hidden's dtype; got " + describe(out));
        for (const Array* a : {&hidden, &ids, &weights, static_cast<const Array*>(&out)})
            if (!c_contiguous(*a)) throw ShapeError(where + "arrays must be C-contiguous; got a strided " + describe(*a));

        std::vector<int64_t> id(size_t(T * k));
        for (int64_t i = 0; i < T * k; ++i) {
            id[i] = ids64 ? static_cast<const int64_t*>(ids.data())[i] : static_cast<const int32_t*>(ids.data())[i];
            if (id[i] < 0 || id[i] >= E)
                throw ShapeError(where + "topk_ids[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "] = " +
                                 std::to_string(id[i]) + " is not an expert id in [0, " + std::to_string(E) + ")");
        }
        const float* w = static_cast<const float*>(weights.data());
        std::vector<float> xbuf, obuf;
        const float* X = static_cast<const float*>(hidden.data());
        float* O = static_cast<float*>(out.data());
        if (bf16) {
            const uint16_t* hb = static_cast<const uint16_t*>(hidden.data());
            xbuf.resize(size_t(T * H));
            for (int64_t i = 0; i < T * H; ++i) xbuf[i] = ftw::num::bf16_to_f32(hb[i]);
            X = xbuf.data();
            obuf.resize(size_t(T * H));
            O = obuf.data();
        }
        {
            nb::gil_scoped_release release;
            ex_.forward(layer, T, k, X, id.data(), w, O);
        }
        if (bf16) {
            uint16_t* ob = static_cast<uint16_t*>(out.data());
            for (int64_t i = 0; i < T * H; ++i) ob[i] = ftw::num::f32_to_bf16(O[i]);
        }
    }

private:
    cpu::MoeExecutor ex_;
    std::vector<Array> keep_;  // the banks' owners (numpy arrays / torch tensors) stay alive
};

}  // namespace

FTW_BINDINGS(cpu_executor) {
    nb::class_<PyCpuExecutor>(m, "CpuExecutor", "The CPU MoE executor's C++ core (use ftw.runtime.CpuMoeExecutor).")
        .def(nb::init<int>(), nb::arg("threads"))
        .def_prop_ro("threads", &PyCpuExecutor::threads)
        .def("add_format", &PyCpuExecutor::add_format, nb::arg("name"), nb::arg("options"))
        .def("add_layer", &PyCpuExecutor::add_layer, nb::arg("layer"), nb::arg("format"), nb::arg("E"), nb::arg("H"),
             nb::arg("I"), nb::arg("banks"), nb::arg("activation"), nb::arg("limit"), nb::arg("alpha"))
        .def("forward", &PyCpuExecutor::forward, nb::arg("layer"), nb::arg("hidden"), nb::arg("topk_ids"),
             nb::arg("topk_weights"), nb::arg("out"));
    m.def("cpu_formats", &ftw::cpu::format_names, "Formats the CPU executor has kernels for (the C++ registry).");
}
