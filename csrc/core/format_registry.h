// The one table of CPU expert formats: name -> FormatInfo {name, factory of its kernel}.
// Each format's kernel lives in csrc/formats/<name>/cpu.cpp, defines one FormatInfo and
// registers it with FTW_CPU_FORMAT (ggml's type-traits pattern, self-registered as the CUDA
// side's FTW_CUDA_FORMAT is). Nothing else in csrc/ switches on a format name. Adding a
// format: its folder; no list to edit (the module links every source, so every registrar runs).
#pragma once

#include <string>
#include <vector>

#include "core/cpu_format.h"

namespace ftw::cpu {

// Every registered CPU format, by name.
const std::vector<const FormatInfo*>& formats();
std::vector<std::string> format_names();
// nullptr when `name` is not registered.
const FormatInfo* find_format(const std::string& name);

struct FormatRegistrar {
    explicit FormatRegistrar(const FormatInfo* f);
};

}  // namespace ftw::cpu

// In csrc/formats/<name>/cpu.cpp, after its FormatInfo: FTW_CPU_FORMAT(kName);
#define FTW_CPU_FORMAT(VAR) static const ::ftw::cpu::FormatRegistrar ftw_cpu_registrar_##VAR(&VAR)
