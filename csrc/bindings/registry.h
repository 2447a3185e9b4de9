// Self-registering bindings: a file under csrc/bindings/ writes
//
//     FTW_BINDINGS(pools) {
//         m.def("plan_copies", ...);   // m is nanobind::module_& (the ftw._runtime module)
//     }
//
// and module.cpp runs every registered binder (in name order) when ftw._runtime is imported.
// Adding bindings therefore touches no shared list.
#pragma once

#include <nanobind/nanobind.h>

namespace ftw::bindings {

using Binder = void (*)(nanobind::module_&);

// Registers `fn` under `name` during static initialisation; a duplicate name is a build bug and
// is reported when the module is imported.
struct Registrar {
    Registrar(const char* name, Binder fn);
};

// Runs every registered binder on `m`.
void run_all(nanobind::module_& m);

}  // namespace ftw::bindings

#define FTW_BINDINGS(name)                                                                \
    static void ftw_bind_##name(nanobind::module_& m);                                    \
    static const ::ftw::bindings::Registrar ftw_registrar_##name(#name, &ftw_bind_##name); \
    static void ftw_bind_##name([[maybe_unused]] nanobind::module_& m)
