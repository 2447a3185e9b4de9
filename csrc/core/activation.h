// The model's activation (ftw.formats.Activation): how an expert combines gate and up.
//   silu:             silu(gate) * up
//   silu with limit:  gate = min(gate, limit); up = clamp(up, -limit, limit); silu(gate) * up
//   swiglu_oai:       gate = min(gate, limit); up = clamp(up, -limit, limit);
//                     (up + 1) * gate * sigmoid(alpha * gate)                    (gpt-oss)
// Expert biases are added to gate and up before (by the executor).
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include "core/errors.h"

namespace ftw {

struct Activation {
    enum class Kind { Silu, SwigluOai };
    Kind kind = Kind::Silu;
    float limit = std::numeric_limits<float>::infinity();  // no clamp
    float alpha = 1.0f;

    // kind "silu" or "swiglu_oai"; limit <= 0 means none
    static Activation make(const std::string& kind, double limit, double alpha) {
        Activation a;
        if (kind == "silu") {
            a.kind = Kind::Silu;
        } else if (kind == "swiglu_oai") {
            a.kind = Kind::SwigluOai;
            if (!(limit > 0) || !(alpha > 0))
                throw FormatError("activation swiglu_oai needs a positive limit and alpha");
        } else {
            throw UnsupportedError("activation '" + kind + "' is not one the CPU executor computes (silu, swiglu_oai)");
        }
        if (limit > 0) a.limit = float(limit);
        a.alpha = float(alpha > 0 ? alpha : 1.0);
        return a;
    }

    float operator()(float gate, float up) const {
        gate = std::fmin(gate, limit);
        up = std::fmax(std::fmin(up, limit), -limit);
        if (kind == Kind::Silu) return gate / (1.0f + std::exp(-gate)) * up;
        return (up + 1.0f) * gate / (1.0f + std::exp(-alpha * gate));
    }
};

}  // namespace ftw
