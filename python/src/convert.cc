// Python objects into what the C++ calls take: durations, float buffers, keys, bytes.
#include "binding.h"

namespace pscore::python {

Duration Seconds(double s) {
  if (s < 0) s = 0;
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

FloatView FloatBuffer(py::buffer b, bool writable) {
  FloatView v;
  v.info = b.request(writable);
  if (v.info.format != py::format_descriptor<float>::format() || v.info.itemsize != 4) {
    Raise(Status(Code::kInvalidArgument, "values must be float32, got format '" + v.info.format + "'"));
  }
  ssize_t expect = v.info.itemsize;
  for (ssize_t i = v.info.ndim - 1; i >= 0; --i) {
    if (v.info.shape[i] > 1 && v.info.strides[i] != expect) {
      Raise(Status(Code::kInvalidArgument, "values must be C-contiguous"));
    }
    expect *= v.info.shape[i];
  }
  v.data = static_cast<float*>(v.info.ptr);
  v.n = static_cast<size_t>(v.info.size);
  return v;
}

std::vector<uint64_t> Keys(py::handle keys) {
  std::vector<uint64_t> out;
  if (py::isinstance<py::buffer>(keys) && !py::isinstance<py::bytes>(keys)) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(keys).request();
    if (info.ndim == 1 && info.itemsize == 8 && (info.format == "Q" || info.format == "L" || info.format == "K" ||
                                                 info.format == "q" || info.format == "l")) {
      if (info.strides[0] == 8) {
        const uint64_t* p = static_cast<const uint64_t*>(info.ptr);
        out.assign(p, p + info.shape[0]);
        return out;
      }
    }
  }
  for (py::handle k : keys) out.push_back(k.cast<uint64_t>());
  return out;
}

std::string BytesOf(py::handle v) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::bytes>(v)) return v.cast<std::string>();
  PyObject* b = PyBytes_FromObject(v.ptr());  // bytearray, memoryview, buffers
  if (b == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::bytes>(b).cast<std::string>();
}

}  // namespace pscore::python
