#include "core/cpu_format.h"

#include <sstream>

namespace ftw::cpu {

namespace {

struct DTypeRow {
    DType d;
    const char* name;
    int size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::BF16, "bf16", 2}, {DType::F16, "f16", 2}, {DType::F32, "f32", 4},
    {DType::F8E4M3, "f8_e4m3", 1}, {DType::E8M0, "e8m0", 1}, {DType::U8, "u8", 1},
    {DType::I8, "i8", 1}, {DType::U32, "u32", 4},
};

}  // namespace

DType parse_dtype(const std::string& name) {
    for (const auto& r : kDTypes)
        if (name == r.name) return r.d;
    throw UnsupportedError("bank dtype '" + name + "' is not one the CPU executor reads");
}

const char* dtype_name(DType d) {
    for (const auto& r : kDTypes)
        if (r.d == d) return r.name;
    return "?";
}

int dtype_size(DType d) {
    for (const auto& r : kDTypes)
        if (r.d == d) return r.size;
    return 0;
}

const Bank& LayerBanks::at(const std::string& name) const {
    auto it = banks.find(name);
    if (it == banks.end() || !it->second.present) throw FormatError("the layer has no bank '" + name + "'");
    return it->second;
}

int64_t option_int(const Options& o, const std::string& key, int64_t fallback) {
    auto it = o.find(key);
    if (it == o.end()) return fallback;
    try {
        size_t used = 0;
        int64_t v = std::stoll(it->second, &used);
        if (used == it->second.size()) return v;
    } catch (const std::exception&) {
    }
    throw FormatError("option '" + key + "' must be an integer, got '" + it->second + "'");
}

std::vector<int64_t> option_ints(const Options& o, const std::string& key, std::vector<int64_t> fallback) {
    auto it = o.find(key);
    if (it == o.end()) return fallback;
    std::vector<int64_t> out;
    std::stringstream ss(it->second);
    std::string part;
    while (std::getline(ss, part, ',')) {
        try {
            out.push_back(std::stoll(part));
        } catch (const std::exception&) {
            throw FormatError("option '" + key + "' must be integers, got '" + it->second + "'");
        }
    }
    return out;
}

std::string option_str(const Options& o, const std::string& key, const std::string& fallback) {
    auto it = o.find(key);
    return it == o.end() ? fallback : it->second;
}

}  // namespace ftw::cpu
