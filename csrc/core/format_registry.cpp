#include "core/format_registry.h"

#include <algorithm>
#include <string>

namespace ftw::cpu {

namespace {
// a function-local static: registrars in other files run during static initialisation, in
// an order the language leaves open, and each must find the table already constructed
std::vector<const FormatInfo*>& table() {
    static std::vector<const FormatInfo*> t;
    return t;
}
}  // namespace

FormatRegistrar::FormatRegistrar(const FormatInfo* f) {
    auto& t = table();
    auto at = std::lower_bound(t.begin(), t.end(), f, [](const FormatInfo* a, const FormatInfo* b) {
        return std::string(a->name) < std::string(b->name);
    });
    t.insert(at, f);  // kept sorted by name: the order does not depend on link order
}

const std::vector<const FormatInfo*>& formats() { return table(); }

std::vector<std::string> format_names() {
    std::vector<std::string> names;
    for (const FormatInfo* f : formats()) names.emplace_back(f->name);
    return names;
}

const FormatInfo* find_format(const std::string& name) {
    for (const FormatInfo* f : formats())
        if (name == f->name) return f;
    return nullptr;
}

}  // namespace ftw::cpu
