// Shared by the binding files of pscore._pscore: errors, conversions of Python objects,
// waits that release the GIL, the keepalive of buffers C++ may still use, and the Bind*
// functions module.cc calls. Every function here is called with the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pscore/comm/tls.h"
#include "pscore/core/status.h"
#include "pscore/node/common/options.h"

namespace pscore::python {

namespace py = pybind11;
using namespace std::chrono_literals;

// ---- errors (errors.cc): one Python class per Code, all under pscore.Error ----
// Sets the Python error of st's Code and throws py::error_already_set.
[[noreturn]] void Raise(const Status& st);
inline void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}
// pscore.Error, the base of every class (null before BindErrors ran).
PyObject* ErrorBase();

// Seconds from Python (negative: 0).
Duration Seconds(double s);

// How long a wait runs with the GIL released before Python's signal handlers run again.
inline constexpr auto kSlice = std::chrono::milliseconds(50);

// Runs Python's signal handlers; a KeyboardInterrupt raised there propagates.
inline void CheckSignals() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Waits until `fut` is ready with the GIL released, in slices; between slices, with the
// GIL, runs Python's signal handlers.
template <typename F>
void AwaitReady(const F& fut) {
  for (;;) {
    {
      py::gil_scoped_release nogil;
      if (fut.wait_for(kSlice) == std::future_status::ready) return;
    }
    CheckSignals();
  }
}

// AwaitReady, then the future's value.
template <typename T>
T Wait(std::future<T>& fut) {
  AwaitReady(fut);
  py::gil_scoped_release nogil;
  return fut.get();
}

// ---- conversions (convert.cc) ----
// A float32 C-contiguous buffer of the caller (numpy array, memoryview, ...).
struct FloatView {
  py::buffer_info info;
  float* data = nullptr;
  size_t n = 0;
};
FloatView FloatBuffer(py::buffer b, bool writable);
std::vector<uint64_t> Keys(py::handle keys);
// bytes, bytearray or memoryview as they are; str as UTF-8.
std::string BytesOf(py::handle v);
inline std::vector<uint32_t> Lens(const std::optional<std::vector<uint32_t>>& lens) {
  return lens ? *lens : std::vector<uint32_t>{};
}

// ---- options (options.cc) ----
// tls_cert, tls_key, tls_ca: PEM files, all three or none (the C++ flags' rule); the loaded
// context, or null (plaintext) when none is given. A bad file raises.
std::shared_ptr<comm::TlsContext> LoadTls(const comm::TlsFiles& files);
// Takes kwarg `k` into `files` if it is one of the three TLS options.
bool TlsOption(const std::string& k, py::handle v, comm::TlsFiles& files);
// The keyword options of Worker and Server (an unknown one raises InvalidArgument).
void ApplyNodeOptions(node::NodeOptions& o, const py::kwargs& kw);

// ---- keepalive ----
// Memory of Python objects that the C++ side may still read or write after the call
// that handed it over returned (an interrupted wait, an async call): the object is kept
// until the call's future is ready and nothing on the C++ side holds the token any more.
// Touched only with the GIL held.
struct Keepalive {
  std::function<bool()> done;  // the call's future is ready
  std::weak_ptr<const void> token;
  py::object obj;
  std::shared_ptr<void> extra;  // e.g. a lens vector the call writes
};

class Keeper {
 public:
  void Add(Keepalive k) {
    Prune();
    items_.push_back(std::move(k));
  }
  void Prune() {
    std::vector<Keepalive> left;
    for (Keepalive& k : items_) {
      bool ready = !k.done || k.done();
      if (ready && k.token.expired()) continue;
      left.push_back(std::move(k));
    }
    items_.swap(left);
  }
  size_t size() const { return items_.size(); }

 private:
  std::vector<Keepalive> items_;
};

// Whether a call's future is ready, as the Keeper asks it.
template <typename T>
std::function<bool()> Signal(std::shared_future<T> f) {
  return [f] { return f.wait_for(0s) == std::future_status::ready; };
}

// ---- the module's parts, in the order module.cc binds them ----
void BindErrors(py::module_& m);      // errors.cc
void BindScheduler(py::module_& m);   // scheduler_binding.cc
void BindServer(py::module_& m);      // server_binding.cc
void BindWorker(py::module_& m);      // worker_binding.cc
void BindRankTables(py::module_& m);  // ranktables_binding.cc
void BindAdminClient(py::module_& m); // admin_binding.cc

}  // namespace pscore::python
