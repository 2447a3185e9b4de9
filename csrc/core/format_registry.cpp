#include "core/format_registry.h"

namespace ftw::cpu {

// defined in csrc/formats/<name>/cpu.cpp
extern const FormatInfo kBf16, kFp8Block, kNvfp4, kMxfp4, kDsFp4, kMxfp8, kAffine, kGguf;

const std::vector<const FormatInfo*>& formats() {
    static const std::vector<const FormatInfo*> table = {
        &kBf16, &kFp8Block, &kNvfp4, &kMxfp4, &kDsFp4, &kMxfp8, &kAffine, &kGguf,
    };
    return table;
}

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
