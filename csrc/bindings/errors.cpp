// C++ exceptions -> ftw.errors: the translator looks the Python class up in ftw.errors when an
// exception crosses, so the classes stay defined once (in Python).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings/registry.h"
#include "core/errors.h"

namespace nb = nanobind;

namespace {

void raise_as(const char* cls_name, const char* what) {
    // Python's own import machinery: ftw.errors is plain Python and always importable here.
    nb::object cls = nb::module_::import_("ftw.errors").attr(cls_name);
    PyErr_SetString(cls.ptr(), what);
}

}  // namespace

FTW_BINDINGS(errors) {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ftw::FormatError& e) {  // ShapeError included
            raise_as("FormatError", e.what());
        } catch (const ftw::UnsupportedError& e) {
            raise_as("UnsupportedError", e.what());
        } catch (const ftw::Error& e) {
            raise_as("FtwError", e.what());
        }
    });

    // For tests of the translation itself: throws the named C++ error with `message`.
    m.def("_raise_for_test", [](const std::string& kind, const std::string& message) {
        if (kind == "format") throw ftw::FormatError(message);
        if (kind == "shape") throw ftw::ShapeError(message);
        if (kind == "unsupported") throw ftw::UnsupportedError(message);
        if (kind == "cuda") throw ftw::CudaError(message);
        if (kind == "error") throw ftw::Error(message);
        throw std::invalid_argument("unknown error kind: " + kind);
    });
}
