// The C++ side of ftw's error hierarchy (ftw/errors.py). Code in csrc/ throws these; the binding
// layer (csrc/bindings/errors.cpp) turns each into the ftw.errors class of the same meaning, so
// Python callers catch ftw.FtwError subclasses and never see a bare RuntimeError or an abort.
#pragma once

#include <stdexcept>
#include <string>

namespace ftw {

// Base of everything ftw's C++ refuses on purpose -> ftw.errors.FtwError.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Banks or options that do not match their format -> ftw.errors.FormatError.
struct FormatError : Error {
    using Error::Error;
};

// An argument whose shape, dtype or value range is wrong (hidden states, routing ids) ->
// ftw.errors.FormatError; the message names what was expected.
struct ShapeError : FormatError {
    using FormatError::FormatError;
};

// Well-formed input that this build does not handle (a format, a ggml type, no CUDA) ->
// ftw.errors.UnsupportedError.
struct UnsupportedError : Error {
    using Error::Error;
};

// A CUDA call failed -> ftw.errors.FtwError (named "CUDA error ..." in the message).
struct CudaError : Error {
    using Error::Error;
};

}  // namespace ftw
