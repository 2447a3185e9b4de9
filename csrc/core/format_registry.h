// The one table of CPU expert formats: name -> {banks it reads, factory of its kernel}.
// Each format's kernel lives in csrc/formats/<name>/cpu.cpp and exports one FormatInfo; the table
// in format_registry.cpp lists them (ggml's type-traits pattern). Nothing else in csrc/ switches
// on a format name.
#pragma once

#include <string>
#include <vector>

namespace ftw::cpu {

struct FormatInfo {
    const char* name;                 // the registry name in ftw.formats (e.g. "nvfp4")
};

// Every registered CPU format, in table order.
const std::vector<const FormatInfo*>& formats();
std::vector<std::string> format_names();
// nullptr when `name` is not registered.
const FormatInfo* find_format(const std::string& name);

}  // namespace ftw::cpu
