// The one extension module, ftw._runtime: runs every binder registered with FTW_BINDINGS.
#include <map>
#include <stdexcept>
#include <string>

#include "bindings/registry.h"

namespace ftw::bindings {
namespace {

struct Table {
    std::map<std::string, Binder> binders;  // ordered: binders run in name order
    std::string duplicate;                  // first name registered twice, reported at import
};

Table& table() {
    static Table t;  // function-local: constructed before the first Registrar uses it
    return t;
}

}  // namespace

Registrar::Registrar(const char* name, Binder fn) {
    auto [it, inserted] = table().binders.emplace(name, fn);
    if (!inserted && table().duplicate.empty()) table().duplicate = name;
}

void run_all(nanobind::module_& m) {
    if (!table().duplicate.empty())
        throw std::logic_error("FTW_BINDINGS(" + table().duplicate + ") is defined twice");
    for (auto& [name, fn] : table().binders) fn(m);
}

}  // namespace ftw::bindings

NB_MODULE(_runtime, m) {
    m.doc() = "ftw's bundled C++/CUDA runtime (see ftw.runtime for the Python API)";
    ftw::bindings::run_all(m);
}
