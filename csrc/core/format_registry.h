// The one table of CPU expert formats: name -> FormatInfo {name, factory of its kernel}.
// Each format's kernel lives in csrc/formats/<name>/cpu.cpp and defines one FormatInfo; the
// table in format_registry.cpp lists them (ggml's type-traits pattern). Nothing else in csrc/
// switches on a format name. Adding a format: its folder, and one line in the table.
#pragma once

#include <string>
#include <vector>

#include "core/cpu_format.h"

namespace ftw::cpu {

// Every registered CPU format, in table order.
const std::vector<const FormatInfo*>& formats();
std::vector<std::string> format_names();
// nullptr when `name` is not registered.
const FormatInfo* find_format(const std::string& name);

}  // namespace ftw::cpu
