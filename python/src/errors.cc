// pscore.Error and one subclass per Code (TimeoutError and ValueError also bases of
// Timeout and InvalidArgument), and Raise, which picks the class of a Status.
#include "binding.h"

namespace pscore::python {
namespace {

constexpr int kCodes = 14;
PyObject* g_error = nullptr;
PyObject* g_by_code[kCodes] = {};

}  // namespace

[[noreturn]] void Raise(const Status& st) {
  int c = static_cast<int>(st.code());
  PyObject* cls = (c > 0 && c < kCodes && g_by_code[c]) ? g_by_code[c] : g_error;
  PyErr_SetString(cls, st.ToString().c_str());
  throw py::error_already_set();
}

PyObject* ErrorBase() { return g_error; }

void BindErrors(py::module_& m) {
  static const char* names[kCodes] = {nullptr,       "InvalidArgument",   "ProtocolError", "Unavailable", "Timeout",
                                      "ResourceExhausted", "InternalError", "NotFound",   "AlreadyExists", "Cancelled",
                                      "FailedPrecondition", "PermissionDenied", "Aborted", "Unimplemented"};
  g_error = PyErr_NewExceptionWithDoc("pscore._pscore.Error", "Base of every pscore error; .code is the Code.",
                                      PyExc_RuntimeError, nullptr);
  py::handle(g_error).attr("code") = py::none();
  m.attr("Error") = py::handle(g_error);
  for (int c = 1; c < kCodes; ++c) {
    py::tuple bases;
    if (c == static_cast<int>(Code::kTimeout)) bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError));
    else if (c == static_cast<int>(Code::kInvalidArgument)) bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
    else bases = py::make_tuple(py::handle(g_error));
    std::string qual = std::string("pscore._pscore.") + names[c];
    g_by_code[c] = PyErr_NewException(qual.c_str(), bases.ptr(), nullptr);
    py::handle(g_by_code[c]).attr("code") = c;
    m.attr(names[c]) = py::handle(g_by_code[c]);
  }
}

}  // namespace pscore::python
