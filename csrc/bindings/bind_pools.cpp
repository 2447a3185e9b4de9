// ftw._runtime: the pool planner and the slot pools (csrc/pools/), host twin and, in CUDA
// builds, the CUDA backend. ftw/runtime/pools.py is the Python API over these.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings/registry.h"
#include "pools/planner.h"
#include "pools/slot_pools.h"
#ifdef FTW_WITH_CUDA
#include "cuda/pools_cuda.h"
#endif

namespace nb = nanobind;
using namespace ftw::pools;

namespace {

PlanRequest request_of(const nb::dict& d) {
    PlanRequest r;
    r.num_experts = nb::cast<int>(d["num_experts"]);
    r.top_k = nb::cast<int>(d["top_k"]);
    r.bank_names = nb::cast<std::vector<std::string>>(d["bank_names"]);
    for (nb::handle p : nb::cast<nb::list>(d["pools"])) {
        PoolSpec s;
        s.key = nb::cast<std::string>(p[nb::int_(0)]);
        s.layers = nb::cast<std::vector<int>>(p[nb::int_(1)]);
        s.row_bytes = nb::cast<std::vector<int64_t>>(p[nb::int_(2)]);
        r.pools.push_back(std::move(s));
    }
    auto get = [&](const char* k, int64_t dflt) {
        return d.contains(k) && !d[k].is_none() ? nb::cast<int64_t>(d[k]) : dflt;
    };
    r.gpu_mem = get("gpu_mem", -1);
    r.total_slots = get("total_slots", -1);
    r.decode_batch = static_cast<int>(get("decode_batch", 0));
    r.prefill_chunk = static_cast<int>(get("prefill_chunk", 0));
    r.staging_experts = static_cast<int>(get("staging_experts", 8));
    return r;
}

nb::dict dict_of(const Plan& plan) {
    nb::dict d;
    d["num_experts"] = plan.num_experts;
    d["top_k"] = plan.top_k;
    d["prefill_chunk"] = plan.prefill_chunk;
    d["bank_names"] = plan.bank_names;
    d["decode_batch"] = plan.decode_batch;
    d["staging_offset"] = plan.staging_offset;
    d["staging_half"] = plan.staging_half;
    d["bank_bytes"] = plan.bank_bytes;
    d["staging_bytes"] = plan.staging_bytes;
    d["table_bytes"] = plan.table_bytes;
    d["total_bytes"] = plan.total_bytes;
    d["total_slots"] = plan.total_slots;
    d["min_gpu_mem"] = plan.min_gpu_mem;
    d["min_slots"] = plan.min_slots;
    nb::list pools;
    for (const auto& p : plan.pools) {
        nb::dict q;
        q["format"] = p.key;
        q["layers"] = p.layers;
        q["row_bytes"] = p.row_bytes;
        q["stride"] = p.stride;
        q["offset"] = p.offset;
        q["expert_bytes"] = p.expert_bytes;
        q["slots"] = p.slots;
        q["experts"] = p.experts;
        q["share"] = p.share();
        q["bytes"] = p.bytes();
        q["decode_need"] = p.decode_need;
        q["decode_batch"] = p.decode_batch;
        q["staging_group"] = p.staging_group;
        pools.append(q);
    }
    d["pools"] = pools;
    return d;
}

nb::dict view_dict(const ftw::PoolLayerView& v) {
    nb::dict d;
    std::vector<uintptr_t> base;
    std::vector<int64_t> rows;
    for (int j = 0; j < v.num_banks; ++j) {
        base.push_back(reinterpret_cast<uintptr_t>(v.bank_base[j]));
        rows.push_back(v.row_bytes[j]);
    }
    d["num_banks"] = v.num_banks;
    d["bank_base"] = base;
    d["row_bytes"] = rows;
    d["slot_of_expert"] = reinterpret_cast<uintptr_t>(v.slot_of_expert);
    d["num_experts"] = v.num_experts;
    return d;
}

nb::dict stats_dict(const PoolStats& s) {
    nb::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    d["staged"] = s.staged;
    d["copy_ops"] = s.copy_ops;
    d["copy_bytes"] = s.copy_bytes;
    return d;
}

std::unique_ptr<Backend> backend_of(const std::string& name, int device) {
    if (name == "host") return make_host_backend();
#ifdef FTW_WITH_CUDA
    if (name == "cuda") return make_cuda_backend(device);
#else
    if (name == "cuda") throw ftw::UnsupportedError("pools: this build of ftw._runtime has no CUDA");
#endif
    throw ftw::FormatError("pools: unknown backend " + name + " (host, cuda)");
}

nb::bytes bytes_of(const std::vector<uint8_t>& v) {
    return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

using IdArray = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using LayerArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

FTW_BINDINGS(pools) {
    // CapacityError crosses as ftw.runtime.pools.CapacityError (an ftw.errors.FtwError); binders
    // run in name order, so this translator is tried before the general one in errors.cpp
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const CapacityError& e) {
            nb::object cls = nb::module_::import_("ftw.runtime.pools").attr("CapacityError");
            PyErr_SetString(cls.ptr(), e.what());
        }
    });

    m.def("plan_pools", [](const nb::dict& req) { return dict_of(make_plan(request_of(req))); },
          "Plans slot pools from a request dict (see ftw/runtime/pools.py).");

    nb::class_<SlotPools>(m, "SlotPools")
        .def("__init__",
             [](SlotPools* self, const nb::dict& req, std::vector<std::vector<int>> format_banks,
                const std::string& eviction, double lam, const std::string& backend, int device) {
                 Eviction ev;
                 if (eviction == "lru") ev = Eviction::lru;
                 else if (eviction == "lrfu") ev = Eviction::lrfu;
                 else throw ftw::FormatError("pools: unknown eviction " + eviction + " (lru, lrfu)");
                 new (self) SlotPools(make_plan(request_of(req)), std::move(format_banks), ev, lam,
                                      backend_of(backend, device));
             },
             nb::arg("request"), nb::arg("format_banks"), nb::arg("eviction") = "lru",
             nb::arg("lam") = 0.1, nb::arg("backend") = "host", nb::arg("device") = 0)
        .def_prop_ro("plan", [](SlotPools& s) { return dict_of(s.plan()); })
        .def_prop_ro("backend", [](SlotPools& s) { return s.backend().name(); })
        .def_prop_ro("last_batch_calls", [](SlotPools& s) { return s.backend().last_batch_calls; })
        .def_prop_ro("last_kernel_calls", [](SlotPools& s) { return s.backend().last_kernel_calls; })
        .def_prop_ro("batch_call_failures", [](SlotPools& s) { return s.backend().batch_call_failures; })
        .def("set_host_bank",
             [](SlotPools& s, int bank, int layer, nb::ndarray<nb::c_contig> a) {
                 const int dev = a.device_type();
                 if (dev != nb::device::cpu::value && dev != nb::device::cuda_host::value)
                     throw ftw::FormatError("pools: host banks must be in host memory");
                 s.set_host_bank(bank, layer, a.data(), static_cast<int64_t>(a.nbytes()));
             })
        .def("set_timing", [](SlotPools& s, bool on) { s.backend().set_timing(on); })
        .def_prop_ro("last_copy_ms", [](SlotPools& s) { return s.backend().last_copy_ms(); })
        .def("set_batch_min_row", [](SlotPools& s, int64_t bytes) { s.backend().set_batch_min_row(bytes); })
        .def("set_compute_stream", [](SlotPools& s, int64_t stream) { s.backend().set_compute_stream(stream); })
        .def("begin_step", &SlotPools::begin_step)
        .def("request",
             [](SlotPools& s, LayerArray layers, IdArray ids) {
                 const size_t L = layers.shape(0), K = ids.shape(1);
                 if (ids.shape(0) != L) throw ftw::FormatError("pools: ids must be [layers, k]");
                 std::vector<int> ls(layers.data(), layers.data() + L);
                 std::vector<std::vector<int32_t>> es(L);
                 for (size_t i = 0; i < L; ++i) es[i].assign(ids.data() + i * K, ids.data() + (i + 1) * K);
                 std::vector<std::vector<int32_t>> out;
                 {
                     nb::gil_scoped_release unlocked;
                     out = s.request(ls, es);
                 }
                 auto* buf = new int32_t[L * K];
                 for (size_t i = 0; i < L; ++i) std::memcpy(buf + i * K, out[i].data(), K * 4);
                 nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
                 return nb::ndarray<nb::numpy, int32_t, nb::ndim<2>>(buf, {L, K}, owner);
             })
        .def("prefill",
             [](SlotPools& s, int layer, std::vector<int32_t> ids) {
                 auto p = s.prefill(layer, ids);
                 return std::make_pair(p.hits, p.groups);
             })
        .def("stage", [](SlotPools& s, int layer, std::vector<int32_t> group) { return view_dict(s.stage(layer, group)); })
        .def("view", [](SlotPools& s, int layer) { return view_dict(s.view(layer)); })
        .def("join", &SlotPools::join, nb::arg("channel") = 0)
        .def("release", &SlotPools::release)
        .def("sync", &SlotPools::sync)
        .def("pool_of", &SlotPools::pool_of)
        .def("stats", [](SlotPools& s, int pool) { return stats_dict(s.stats(pool)); })
        .def("reset_stats", &SlotPools::reset_stats)
        .def("slot_of", &SlotPools::slot_of)
        .def("last_half", &SlotPools::last_half)
        .def("read_slot", [](SlotPools& s, int pool, int bank, int64_t slot) { return bytes_of(s.read_slot(pool, bank, slot)); })
        .def("read_staging", [](SlotPools& s, int half, int pool, int bank, int64_t index) {
            return bytes_of(s.read_staging(half, pool, bank, index));
        })
        .def("read_table", [](SlotPools& s) { return s.read_table(); });
}
