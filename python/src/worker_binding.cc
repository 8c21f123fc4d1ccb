// pscore.Worker: the data plane (push, pull, pull_into, call, broadcast) over the caller's
// buffers without a copy, and the C++ baselines the Python benchmarks are divided by.
#include <memory>

#include "binding.h"
#include "py_node.h"

namespace pscore::python {
namespace {

// The caller's buffer, held (with its Py_buffer) while the C++ side may use its memory.
// Destroyed only with the GIL held (by the Keeper or the calling function).
struct Held {
  py::object obj;
  std::unique_ptr<py::buffer_info> info;
  std::shared_ptr<std::vector<uint32_t>> lens;
};

// Hands `held` to the node's keeper unless the call is over and C++ holds no token.
void KeepUntilDone(PyWorker& w, std::function<bool()> done, const std::shared_ptr<const void>& token,
                   std::shared_ptr<Held> held) {
  if (done() && token.use_count() <= 1) return;
  w.keep.Add(Keepalive{std::move(done), token, py::none(), std::move(held)});
}

void Push(PyWorker& w, py::handle keys_obj, py::buffer values, std::optional<std::vector<uint32_t>> lens_opt) {
  std::vector<uint64_t> keys = Keys(keys_obj);
  auto held = std::make_shared<Held>();
  FloatView v = FloatBuffer(values, false);
  held->obj = values;
  held->info = std::make_unique<py::buffer_info>(std::move(v.info));
  // The token C++ holds while it may read the values (ZPush writes large values from them).
  std::shared_ptr<const void> token = std::make_shared<int>(0);
  std::vector<uint32_t> lens = Lens(lens_opt);
  std::shared_future<Status> f = w.get().ZPush(keys, v.data, v.n, token, lens).share();
  std::function<bool()> done = Signal(f);
  try {
    AwaitReady(f);
  } catch (...) {
    KeepUntilDone(w, done, token, held);
    throw;
  }
  KeepUntilDone(w, done, token, held);
  Check(f.get());
}

py::array_t<float> ToArray(std::vector<float>&& values) {
  auto* heap = new std::vector<float>(std::move(values));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>({static_cast<py::ssize_t>(heap->size())}, {sizeof(float)}, heap->data(), owner);
}

py::object Pull(PyWorker& w, py::handle keys_obj, bool with_lens) {
  std::vector<uint64_t> keys = Keys(keys_obj);
  std::future<Result<node::PullResult>> f = w.get().Pull(keys);
  Result<node::PullResult> r = Wait(f);
  if (!r.ok()) Raise(r.status());
  node::PullResult& res = r.value();
  py::array_t<float> arr = ToArray(std::move(res.values));
  if (!with_lens) return std::move(arr);
  return py::make_tuple(arr, res.lens);
}

std::vector<uint32_t> PullInto(PyWorker& w, py::handle keys_obj, py::buffer out,
                               std::optional<std::vector<uint32_t>> layout) {
  std::vector<uint64_t> keys = Keys(keys_obj);
  auto held = std::make_shared<Held>();
  FloatView v = FloatBuffer(out, true);
  held->obj = out;
  held->info = std::make_unique<py::buffer_info>(std::move(v.info));
  held->lens = std::make_shared<std::vector<uint32_t>>(Lens(layout));
  std::shared_future<Status> f = w.get().PullInto(keys, v.data, v.n, held->lens.get()).share();
  std::function<bool()> done = Signal(f);
  std::shared_ptr<const void> none;
  try {
    AwaitReady(f);
  } catch (...) {
    KeepUntilDone(w, done, none, held);  // dest stays valid until the future is ready
    throw;
  }
  Check(f.get());
  return *held->lens;
}

py::bytes Call(PyWorker& w, int rank, const std::string& name, py::object payload) {
  std::string s = BytesOf(payload);
  std::future<Result<BufferPtr>> f = w.get().Call(rank, name, Buffer::FromString(s));
  Result<BufferPtr> r = Wait(f);
  if (!r.ok()) Raise(r.status());
  const BufferPtr& b = r.value();
  if (!b) return py::bytes("");
  return py::bytes(reinterpret_cast<const char*>(b->data()), b->size());
}

py::list Broadcast(PyWorker& w, const std::string& name, py::object payload) {
  std::string s = BytesOf(payload);
  std::future<Result<std::vector<BufferPtr>>> f = w.get().Broadcast(0, name, Buffer::FromString(s));
  Result<std::vector<BufferPtr>> r = Wait(f);
  if (!r.ok()) Raise(r.status());
  py::list out;
  for (const BufferPtr& b : r.value()) {
    out.append(b ? py::bytes(reinterpret_cast<const char*>(b->data()), b->size()) : py::bytes(""));
  }
  return out;
}

// The same push/pull loop as scripts/bench.sh python runs from Python, here in C++ on the
// same worker and servers (ZPush of a shared vector, PullInto with its layout): the
// baseline the Python figures are divided by. Returns seconds per push and per pull.
std::pair<double, double> CppPushPull(PyWorker& w, uint64_t key, size_t floats, int iters) {
  py::gil_scoped_release nogil;
  node::WorkerNode& n = w.get();
  std::vector<uint64_t> keys = {key};
  auto vals = std::make_shared<const std::vector<float>>(floats, 0.001f);
  std::vector<float> dest(floats);
  std::vector<uint32_t> lens = {static_cast<uint32_t>(floats)};
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    Status st = n.ZPush(keys, vals).get();
    if (!st.ok()) throw std::runtime_error(st.ToString());
  }
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    Status st = n.PullInto(keys, dest.data(), dest.size(), &lens).get();
    if (!st.ok()) throw std::runtime_error(st.ToString());
  }
  auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count() / iters, std::chrono::duration<double>(t2 - t1).count() / iters};
}

// Latencies (seconds, one per call) of `iters` Pulls of `keys` from C++.
std::vector<double> CppPullLatencies(PyWorker& w, const std::vector<uint64_t>& keys, int iters) {
  py::gil_scoped_release nogil;
  node::WorkerNode& n = w.get();
  std::vector<double> out;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Result<node::PullResult> r = n.Pull(keys).get();
    if (!r.ok()) throw std::runtime_error(r.status().ToString());
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

}  // namespace

void BindWorker(py::module_& m) {
  py::class_<PyWorker> worker(m, "Worker");
  worker.def(py::init([](py::kwargs kw) {
           node::NodeOptions o;
           o.role = pb::WORKER;
           ApplyNodeOptions(o, kw);
           auto w = std::make_unique<PyWorker>();
           w->node = std::make_unique<node::WorkerNode>(o);
           w->node->SetCallbacks(QueueCallbacks(w->events));
           return w;
         }))
      .def("push", &Push, py::arg("keys"), py::arg("values"), py::arg("lens") = py::none())
      .def("pull", &Pull, py::arg("keys"), py::arg("with_lens") = false)
      .def("pull_into", &PullInto, py::arg("keys"), py::arg("out"), py::arg("lens") = py::none())
      .def("call", &Call, py::arg("rank"), py::arg("name"), py::arg("payload") = py::bytes(""))
      .def("broadcast", &Broadcast, py::arg("name"), py::arg("payload") = py::bytes(""))
      .def_property_readonly("in_place_pulls", [](PyWorker& w) { return w.get().in_place_pulls(); })
      .def_property_readonly("payload_bytes_copied", [](PyWorker& w) { return w.get().payload_bytes_copied(); })
      .def_property_readonly("pending_buffers", [](PyWorker& w) {
        w.keep.Prune();
        return w.keep.size();
      });
  BindNodeCommon(worker);

  m.def("_cpp_push_pull", &CppPushPull, py::arg("worker"), py::arg("key"), py::arg("floats"), py::arg("iters"),
        "Benchmark baseline: seconds per ZPush and per PullInto of one key, looped in C++.");
  m.def("_cpp_pull_latencies", &CppPullLatencies, py::arg("worker"), py::arg("keys"), py::arg("iters"),
        "Benchmark baseline: seconds of each of `iters` Pulls, called from C++.");
}

}  // namespace pscore::python
