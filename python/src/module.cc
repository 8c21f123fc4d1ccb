// pscore._pscore: the Python binding. A thin layer over the C++ API (docs/embedding.md,
// docs/python.md): every blocking call releases the GIL and waits in slices, checking for
// signals (Ctrl-C) between them with the GIL held; float arrays cross through the buffer
// protocol without a copy between the caller's memory and the C++ calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "pscore/comm/tls.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/common/ranktable_subscriber.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

namespace py = pybind11;
using namespace std::chrono_literals;

namespace pscore::python {
namespace {

// ---- errors: one Python class per Code, all under pscore.Error ----
PyObject* g_error = nullptr;
PyObject* g_by_code[14] = {};

[[noreturn]] void Raise(const Status& st) {
  int c = static_cast<int>(st.code());
  PyObject* cls = (c > 0 && c < 14 && g_by_code[c]) ? g_by_code[c] : g_error;
  PyErr_SetString(cls, st.ToString().c_str());
  throw py::error_already_set();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

Duration Seconds(double s) {
  if (s < 0) s = 0;
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

constexpr auto kSlice = std::chrono::milliseconds(50);

// Waits for a future with the GIL released, in slices; between slices, with the GIL,
// runs Python's signal handlers (a KeyboardInterrupt raised there propagates).
template <typename T>
T Wait(std::future<T>& fut) {
  for (;;) {
    {
      py::gil_scoped_release nogil;
      if (fut.wait_for(kSlice) == std::future_status::ready) break;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  py::gil_scoped_release nogil;
  return fut.get();
}

// A float32 C-contiguous buffer of the caller (numpy array, memoryview, ...).
struct FloatView {
  py::buffer_info info;
  float* data = nullptr;
  size_t n = 0;
};

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

// bytes, bytearray or memoryview as they are; str as UTF-8.
std::string BytesOf(py::handle v) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::bytes>(v)) return v.cast<std::string>();
  PyObject* b = PyBytes_FromObject(v.ptr());  // bytearray, memoryview, buffers
  if (b == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::bytes>(b).cast<std::string>();
}

std::vector<uint32_t> Lens(const std::optional<std::vector<uint32_t>>& lens) {
  return lens ? *lens : std::vector<uint32_t>{};
}

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

// ---- options ----
// tls_cert, tls_key, tls_ca: PEM files, all three or none (the C++ flags' rule); the loaded
// context, or null (plaintext) when none is given. A bad file raises.
std::shared_ptr<comm::TlsContext> LoadTls(const comm::TlsFiles& files) {
  if (!files.enabled()) return nullptr;
  Result<std::shared_ptr<comm::TlsContext>> tls = comm::TlsContext::Load(files);
  if (!tls.ok()) Raise(tls.status());
  return *tls;
}

// Takes kwarg `k` into `files` if it is one of the three TLS options.
bool TlsOption(const std::string& k, py::handle v, comm::TlsFiles& files) {
  if (k == "tls_cert") files.cert = v.cast<std::string>();
  else if (k == "tls_key") files.key = v.cast<std::string>();
  else if (k == "tls_ca") files.ca = v.cast<std::string>();
  else return false;
  return true;
}

void ApplyNodeOptions(node::NodeOptions& o, const py::kwargs& kw) {
  comm::TlsFiles tls;
  for (auto item : kw) {
    std::string k = item.first.cast<std::string>();
    py::handle v = item.second;
    if (k == "node_id") o.node_id = v.cast<std::string>();
    else if (k == "scheduler_host") o.scheduler_host = v.cast<std::string>();
    else if (k == "scheduler_port") o.scheduler_port = v.cast<int>();
    else if (k == "host") o.host = v.cast<std::string>();
    else if (k == "port") o.port = v.cast<int>();
    else if (k == "rank") o.rank = v.cast<int>();
    else if (k == "heartbeat_interval") o.heartbeat_interval = Seconds(v.cast<double>());
    else if (k == "heartbeat_timeout") o.heartbeat_timeout = Seconds(v.cast<double>());
    else if (k == "scheduler_timeout") o.scheduler_timeout_ms = static_cast<int64_t>(v.cast<double>() * 1000);
    else if (k == "connect_timeout") o.connect_timeout = Seconds(v.cast<double>());
    else if (k == "request_timeout") o.request_timeout = Seconds(v.cast<double>());
    else if (k == "recovery_timeout") o.recovery_timeout = Seconds(v.cast<double>());
    else if (k == "host_name") o.host_name = v.cast<std::string>();
    else if (k == "max_message_bytes") o.max_message_bytes = v.cast<uint64_t>();
    else if (k == "handler_threads") o.handler_threads = v.cast<int>();
    else if (k == "data_dir") o.data_dir = v.cast<std::string>();
    else if (k == "journal_compact_bytes") o.journal_compact_bytes = v.cast<uint64_t>();
    else if (k == "cluster_token") o.cluster_token = v.cast<std::string>();
    else if (k == "max_connections") o.accept.max_connections = v.cast<size_t>();
    else if (TlsOption(k, v, tls)) continue;
    else Raise(Status(Code::kInvalidArgument, "unknown node option '" + k + "'"));
  }
  o.tls = LoadTls(tls);
  // As pscore-node: with TLS and no node_id, the certificate's CN is the node id.
  if (o.tls != nullptr && o.node_id.empty()) o.node_id = o.tls->identity();
}

// ---- events: node callbacks run on the loop thread, which never takes the GIL; they are
// queued here and read by Python with next_event().
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  struct Ev {
    std::string kind, from, payload;
    uint32_t event = 0;
    int code = 0;
  };
  std::deque<Ev> q;
  void Put(Ev e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (q.size() >= 10000) q.pop_front();
      q.push_back(std::move(e));
    }
    cv.notify_all();
  }
};

node::Node::Callbacks QueueCallbacks(const std::shared_ptr<EventQueue>& q) {
  node::Node::Callbacks cb;
  cb.on_user_event = [q](const std::string& from, uint32_t event, const std::string& payload) {
    q->Put({"user", from, payload, event, 0});
  };
  cb.on_cluster_event = [q](const pb::ClusterEventMessage& ev) {
    q->Put({"cluster", ev.node_id(), ev.message(), static_cast<uint32_t>(ev.kind()), ev.error_code()});
  };
  cb.on_fatal = [q](const Status& st) { q->Put({"fatal", "", st.message(), 0, static_cast<int>(st.code())}); };
  return cb;
}

py::object NextEvent(EventQueue& q, double timeout) {
  auto deadline = std::chrono::steady_clock::now() + Seconds(timeout);
  for (;;) {
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(q.mu);
      auto until = std::min(deadline, std::chrono::steady_clock::now() + kSlice);
      q.cv.wait_until(lock, until, [&] { return !q.q.empty(); });
      if (!q.q.empty()) {
        EventQueue::Ev e = std::move(q.q.front());
        q.q.pop_front();
        lock.unlock();
        py::gil_scoped_acquire gil;
        py::dict d;
        d["kind"] = e.kind;
        d["source"] = e.from;
        d["event"] = e.event;
        d["payload"] = py::bytes(e.payload);
        d["code"] = e.code;
        return std::move(d);
      }
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (std::chrono::steady_clock::now() >= deadline) return py::none();
  }
}

// ---- nodes ----
// What every Python node object has: the C++ node, its event queue, and calls that are
// still running on their own thread (Finish) after an interrupted wait.
template <typename N>
struct PyNode {
  std::unique_ptr<N> node;
  std::shared_ptr<EventQueue> events = std::make_shared<EventQueue>();
  Keeper keep;
  std::vector<std::shared_future<Status>> background;

  ~PyNode() {
    if (!node) return;
    py::gil_scoped_release nogil;
    node->Stop();
    for (auto& f : background) f.wait();
  }

  N& get() {
    if (!node) Raise(Status(Code::kFailedPrecondition, "node is closed"));
    return *node;
  }

  void Start() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().Start();
    }
    Check(st);
  }

  void WaitReady(double timeout) {
    auto deadline = std::chrono::steady_clock::now() + Seconds(timeout);
    for (;;) {
      Status st;
      auto left = deadline - std::chrono::steady_clock::now();
      {
        py::gil_scoped_release nogil;
        st = get().WaitForReady(std::max<Duration>(0ms, std::min<Duration>(left, kSlice)));
      }
      if (st.ok()) return;
      if (st.code() != Code::kTimeout || std::chrono::steady_clock::now() >= deadline) Raise(st);
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  // Runs a blocking C++ call on a thread of its own and waits for it interruptibly; an
  // interrupted call goes on until it ends (Stop ends it) and is joined at close.
  void Blocking(std::function<Status()> fn) {
    background.erase(std::remove_if(background.begin(), background.end(),
                                    [](const std::shared_future<Status>& f) {
                                      return f.wait_for(0s) == std::future_status::ready;
                                    }),
                     background.end());
    std::shared_future<Status> f = std::async(std::launch::async, std::move(fn)).share();
    background.push_back(f);  // joined at close even when the wait below is interrupted
    for (;;) {
      {
        py::gil_scoped_release nogil;
        if (f.wait_for(kSlice) == std::future_status::ready) break;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    Check(f.get());
  }

  void Finish(double timeout) {
    N* n = &get();
    Duration t = Seconds(timeout);
    Blocking([n, t] { return n->Finish(t); });
  }

  void WaitForTermination(double timeout) {
    N* n = &get();
    Duration t = Seconds(timeout);
    Blocking([n, t] { return n->WaitForTermination(t); });
  }

  void Close() {
    if (!node) return;
    {
      py::gil_scoped_release nogil;
      node->Stop();
      for (auto& f : background) f.wait();
    }
    background.clear();
    keep.Prune();
    // A call whose future is ready but whose token a queued write still held: Stop has
    // released everything, so the objects can go.
    node.reset();
  }

  // ---- control plane (the scheduler's KV, barriers, errors, events) ----
  void KvSet(const std::string& key, py::object value, bool overwrite) {
    std::string v = BytesOf(value);
    auto p = std::make_shared<std::promise<Status>>();
    std::future<Status> f = p->get_future();
    get().KvSetAsync(key, v, overwrite, [p](Status st) { p->set_value(std::move(st)); });
    Check(Wait(f));
  }
  py::bytes KvGet(const std::string& key, double timeout) {
    auto p = std::make_shared<std::promise<Result<std::string>>>();
    std::future<Result<std::string>> f = p->get_future();
    get().KvGetAsync(key, Seconds(timeout), [p](Result<std::string> r) { p->set_value(std::move(r)); });
    Result<std::string> r = Wait(f);
    if (!r.ok()) Raise(r.status());
    return py::bytes(r.value());
  }
  py::object KvTryGet(const std::string& key) {
    auto p = std::make_shared<std::promise<Result<std::string>>>();
    std::future<Result<std::string>> f = p->get_future();
    get().KvTryGetAsync(key, [p](Result<std::string> r) { p->set_value(std::move(r)); });
    Result<std::string> r = Wait(f);
    if (!r.ok()) {
      if (r.status().code() == Code::kNotFound) return py::none();
      Raise(r.status());
    }
    return py::bytes(r.value());
  }
  py::list KvList(const std::string& dir) {
    Result<std::vector<std::pair<std::string, std::string>>> r = Status(Code::kInternal, "not run");
    {
      py::gil_scoped_release nogil;
      r = get().KvList(dir);
    }
    if (!r.ok()) Raise(r.status());
    py::list out;
    for (auto& [k, v] : r.value()) out.append(py::make_tuple(k, py::bytes(v)));
    return out;
  }
  void KvDelete(const std::string& key) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().KvDelete(key);
    }
    Check(st);
  }
  void Barrier(const std::string& id, double timeout, std::vector<std::string> participants) {
    auto p = std::make_shared<std::promise<Status>>();
    std::future<Status> f = p->get_future();
    get().BarrierAsync(id, Seconds(timeout), std::move(participants),
                       [p](Status st) { p->set_value(std::move(st)); });
    Check(Wait(f));
  }
  void CancelBarrier(const std::string& id) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().CancelBarrier(id);
    }
    Check(st);
  }
  void ReportError(int code, const std::string& message) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().ReportError(code, message);
    }
    Check(st);
  }
  void SendEvent(uint32_t event, py::object payload) {
    std::string s = BytesOf(payload);
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().SendEvent(event, s);
    }
    Check(st);
  }
};

using PyWorker = PyNode<node::WorkerNode>;
using PyServer = PyNode<node::ServerNode>;

// Binds what every node role has.
template <typename P>
void BindNodeCommon(py::class_<P>& c) {
  c.def("start", &P::Start, "Connects to the scheduler and registers (returns once registered).")
      .def("wait_ready", &P::WaitReady, py::arg("timeout") = 60.0,
           "Blocks until every worker and server of the job has registered.")
      .def("finish", &P::Finish, py::arg("timeout") = 60.0,
           "The job's finish barrier over all nodes; raises on a failed job.")
      .def("wait_for_termination", &P::WaitForTermination, py::arg("timeout"),
           "Blocks until the node is terminated (the job finished or failed).")
      .def("close", &P::Close, "Stops the node; pending calls end with pscore.Cancelled. Idempotent.")
      .def_property_readonly("rank", [](P& p) { return p.get().rank(); })
      .def_property_readonly("node_id", [](P& p) { return p.get().node_id(); })
      .def_property_readonly("epoch", [](P& p) { return p.get().epoch(); })
      .def_property_readonly("port", [](P& p) { return p.get().listen_port(); })
      .def_property_readonly("server_count", [](P& p) { return p.get().metadata().server_num(); })
      .def_property_readonly("worker_count", [](P& p) { return p.get().metadata().worker_num(); })
      .def_property_readonly("cluster_state",
                             [](P& p) { return pb::ClusterState_Name(p.get().cluster_state()); })
      .def("node_ids", [](P& p, const std::string& role) {
             pb::NodeRole r = pb::WORKER;
             if (role == "server") r = pb::SERVER;
             else if (role == "scheduler") r = pb::SCHEDULER;
             else if (role != "worker") Raise(Status(Code::kInvalidArgument, "role must be worker, server or scheduler"));
             return p.get().NodeIds(r);
           }, py::arg("role"))
      .def("kv_set", &P::KvSet, py::arg("key"), py::arg("value"), py::arg("overwrite") = true)
      .def("kv_get", &P::KvGet, py::arg("key"), py::arg("timeout") = 60.0)
      .def("kv_try_get", &P::KvTryGet, py::arg("key"))
      .def("kv_list", &P::KvList, py::arg("dir"))
      .def("kv_delete", &P::KvDelete, py::arg("key"))
      .def("barrier", &P::Barrier, py::arg("id"), py::arg("timeout") = 60.0,
           py::arg("participants") = std::vector<std::string>{})
      .def("cancel_barrier", &P::CancelBarrier, py::arg("id"))
      .def("report_error", &P::ReportError, py::arg("code"), py::arg("message"))
      .def("send_event", &P::SendEvent, py::arg("event"), py::arg("payload") = py::bytes(""))
      .def("next_event", [](P& p, double timeout) { return NextEvent(*p.events, timeout); },
           py::arg("timeout") = 0.0);
}

// ---- worker data plane ----

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
    for (;;) {
      {
        py::gil_scoped_release nogil;
        if (f.wait_for(kSlice) == std::future_status::ready) break;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
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
    for (;;) {
      {
        py::gil_scoped_release nogil;
        if (f.wait_for(kSlice) == std::future_status::ready) break;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
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

// ---- server handlers: run on the server's executor threads, which take the GIL for the
// Python function only.
node::DataHandler PythonHandler(py::function fn) {
  std::shared_ptr<py::function> f(new py::function(std::move(fn)), [](py::function* p) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [f](const node::DataRequest& req, node::Responder r) {
    if (!Py_IsInitialized()) return r.Fail(Status(Code::kUnavailable, "python is shutting down"));
    Status failed;
    std::string answer;
    {
      py::gil_scoped_acquire gil;
      try {
        py::bytes payload = req.payload ? py::bytes(reinterpret_cast<const char*>(req.payload->data()),
                                                    req.payload->size())
                                        : py::bytes("");
        py::object out = (*f)(payload, req.from_rank);
        if (!out.is_none()) answer = py::bytes(out);
      } catch (py::error_already_set& e) {
        Code code = Code::kInternal;
        if (e.matches(g_error)) {
          py::object c = e.value().attr("code");
          if (!c.is_none()) code = CodeFromInt(c.cast<int>());
        }
        failed = Status(code, std::string("python handler: ") + e.what());
      } catch (std::exception& e) {
        failed = Status(Code::kInternal, std::string("python handler: ") + e.what());
      }
    }
    if (!failed.ok()) return r.Fail(failed);
    r.Reply(Buffer::FromString(answer));
  };
}

// ---- scheduler ----
// The scheduler as pscore-node runs it: with its rank-table hub (native subscribers,
// RankTables) and, with http_port >= 0, its HTTP endpoint.
struct PyScheduler {
  std::unique_ptr<node::SchedulerNode> node;
  std::unique_ptr<node::RankTableHub> hub;
  std::unique_ptr<node::SchedulerHttp> http;
  int http_port = -1;
  ~PyScheduler() {
    py::gil_scoped_release nogil;
    Close();
  }
  node::SchedulerNode& get() {
    if (!node) Raise(Status(Code::kFailedPrecondition, "scheduler is closed"));
    return *node;
  }
  Status Start() {
    Status st = get().Start();
    if (!st.ok()) return st;
    hub = std::make_unique<node::RankTableHub>(node.get());
    http = std::make_unique<node::SchedulerHttp>(node.get(), hub.get());
    st = hub->Start();
    if (st.ok() && node->options().http_port >= 0) {
      Result<int> port = http->Start(node->options().http_host, node->options().http_port);
      st = port.status();
      if (st.ok()) http_port = *port;
    }
    return st;
  }
  void Close() {  // without the GIL
    if (!node) return;
    if (http) http->Stop();
    if (hub) hub->Stop();
    node->Stop();
    http.reset();
    hub.reset();
    node.reset();
  }
};

node::SchedulerOptions SchedulerOpts(const py::kwargs& kw) {
  node::SchedulerOptions o;
  comm::TlsFiles tls;
  for (auto item : kw) {
    std::string k = item.first.cast<std::string>();
    py::handle v = item.second;
    if (k == "host") o.host = v.cast<std::string>();
    else if (k == "port") o.port = v.cast<int>();
    else if (k == "worker_num") o.worker_num = v.cast<int>();
    else if (k == "server_num") o.server_num = v.cast<int>();
    else if (k == "heartbeat_interval") o.heartbeat_interval = Seconds(v.cast<double>());
    else if (k == "heartbeat_timeout") o.heartbeat_timeout = Seconds(v.cast<double>());
    else if (k == "scale_timeout") o.scale_timeout = Seconds(v.cast<double>());
    else if (k == "max_message_bytes") o.max_message_bytes = v.cast<uint64_t>();
    else if (k == "max_kv_value_bytes") o.max_kv_value_bytes = v.cast<size_t>();
    else if (k == "max_kv_total_bytes") o.max_kv_total_bytes = v.cast<uint64_t>();
    else if (k == "job_id") o.job_id = v.cast<std::string>();
    else if (k == "http_host") o.http_host = v.cast<std::string>();
    else if (k == "http_port") o.http_port = v.cast<int>();
    else if (k == "state_dir") o.state_dir = v.cast<std::string>();
    else if (k == "cluster_token") o.cluster_token = v.cast<std::string>();
    else if (k == "tls_admin_cns") o.tls_admin_cns = v.cast<std::vector<std::string>>();
    else if (TlsOption(k, v, tls)) continue;
    else Raise(Status(Code::kInvalidArgument, "unknown scheduler option '" + k + "'"));
  }
  o.tls = LoadTls(tls);
  return o;
}

core::ParamStore::Options StoreOpts(const std::string& rule, float learning_rate) {
  core::ParamStore::Options s;
  if (rule == "sum") s.rule = core::UpdateRule::kSum;
  else if (rule == "sgd") s.rule = core::UpdateRule::kSgd;
  else if (rule == "assign") s.rule = core::UpdateRule::kAssign;
  else Raise(Status(Code::kInvalidArgument, "rule must be sum, sgd or assign, not '" + rule + "'"));
  s.learning_rate = learning_rate;
  return s;
}

py::dict AdminDict(const pb::AdminResponse& r) {
  py::dict d;
  d["cluster_state"] = pb::ClusterState_Name(r.cluster_state());
  d["epoch"] = r.epoch();
  d["worker_num"] = r.worker_num();
  d["server_num"] = r.server_num();
  d["registered_workers"] = r.registered_workers();
  d["registered_servers"] = r.registered_servers();
  d["message"] = r.message();
  d["last_scale_result"] = r.last_scale_result();
  d["job_result"] = r.job_result();
  py::list nodes;
  for (const auto& n : r.nodes()) {
    py::dict nd;
    nd["node_id"] = n.node_id();
    nd["role"] = pb::NodeRole_Name(n.role());
    nd["rank"] = n.rank_id();
    nd["host"] = n.ip();
    nd["port"] = n.port();
    nodes.append(nd);
  }
  d["nodes"] = nodes;
  return d;
}

// ---- the rank table: the subscriber's callbacks (loop thread) queue the tables; Python
// takes them with next().
struct PyRankTables {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> tables;
    bool closed = false;
    Status why;
  };
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::unique_ptr<node::RankTableSubscriber> sub;

  ~PyRankTables() {
    if (!sub) return;
    py::gil_scoped_release nogil;
    sub->Stop();
  }

  // The next table (JSON text); None after `timeout` seconds (negative: no limit).
  // Raises the reason the stream ended once every queued table was taken (StopIteration
  // for a stream closed without error).
  py::object Next(double timeout) {
    auto deadline = std::chrono::steady_clock::now() + Seconds(timeout < 0 ? 1e9 : timeout);
    for (;;) {
      std::string table;
      bool got = false, closed = false;
      Status why;
      {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(shared->mu);
        auto until = std::min(deadline, std::chrono::steady_clock::now() + kSlice);
        shared->cv.wait_until(lock, until, [&] { return !shared->tables.empty() || shared->closed; });
        if (!shared->tables.empty()) {
          table = std::move(shared->tables.front());
          shared->tables.pop_front();
          got = true;
        } else if (shared->closed) {
          closed = true;
          why = shared->why;
        }
      }
      if (got) return py::str(table);
      if (closed) {
        if (why.ok()) throw py::stop_iteration();
        Raise(why);
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (std::chrono::steady_clock::now() >= deadline) return py::none();
    }
  }
};

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
}  // namespace pscore::python

using namespace pscore;
using namespace pscore::python;

PYBIND11_MODULE(_pscore, m) {
  m.doc() = "pscore: the C++ parameter-server core (binding; use the pscore package)";

  static const char* names[14] = {nullptr,       "InvalidArgument",   "ProtocolError", "Unavailable", "Timeout",
                                  "ResourceExhausted", "InternalError", "NotFound",   "AlreadyExists", "Cancelled",
                                  "FailedPrecondition", "PermissionDenied", "Aborted", "Unimplemented"};
  g_error = PyErr_NewExceptionWithDoc("pscore._pscore.Error", "Base of every pscore error; .code is the Code.",
                                      PyExc_RuntimeError, nullptr);
  py::handle(g_error).attr("code") = py::none();
  m.attr("Error") = py::handle(g_error);
  for (int c = 1; c < 14; ++c) {
    py::tuple bases;
    if (c == static_cast<int>(Code::kTimeout)) bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError));
    else if (c == static_cast<int>(Code::kInvalidArgument)) bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
    else bases = py::make_tuple(py::handle(g_error));
    std::string qual = std::string("pscore._pscore.") + names[c];
    g_by_code[c] = PyErr_NewException(qual.c_str(), bases.ptr(), nullptr);
    py::handle(g_by_code[c]).attr("code") = c;
    m.attr(names[c]) = py::handle(g_by_code[c]);
  }

  py::class_<PyScheduler>(m, "Scheduler")
      .def(py::init([](py::kwargs kw) {
             auto s = std::make_unique<PyScheduler>();
             s->node = std::make_unique<node::SchedulerNode>(SchedulerOpts(kw));
             return s;
           }))
      .def("start", [](PyScheduler& s) {
        s.get();
        Status st;
        {
          py::gil_scoped_release nogil;
          st = s.Start();
        }
        Check(st);
      }, "Listens, starts the rank-table hub (and HTTP with http_port >= 0).")
      .def_property_readonly("http_port", [](PyScheduler& s) { return s.http_port; })
      .def_property_readonly("port", [](PyScheduler& s) { return s.get().port(); })
      .def_property_readonly("cluster_state", [](PyScheduler& s) { return pb::ClusterState_Name(s.get().cluster_state()); })
      .def_property_readonly("epoch", [](PyScheduler& s) { return s.get().epoch(); })
      .def_property_readonly("exited", [](PyScheduler& s) { return s.get().exited(); })
      .def("wait_for_exit", [](PyScheduler& s, double timeout) {
        auto deadline = std::chrono::steady_clock::now() + Seconds(timeout);
        for (;;) {
          Status st;
          auto left = deadline - std::chrono::steady_clock::now();
          {
            py::gil_scoped_release nogil;
            st = s.get().WaitForExit(std::max<Duration>(0ms, std::min<Duration>(left, kSlice)));
          }
          if (st.ok()) return;
          if (st.code() != Code::kTimeout || std::chrono::steady_clock::now() >= deadline) Raise(st);
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        }
      }, py::arg("timeout"))
      .def("close", [](PyScheduler& s) {
        py::gil_scoped_release nogil;
        s.Close();
      });

  py::class_<PyServer> server(m, "Server");
  server.def(py::init([](const std::string& rule, float learning_rate, py::kwargs kw) {
           node::NodeOptions o;
           o.role = pb::SERVER;
           ApplyNodeOptions(o, kw);
           auto s = std::make_unique<PyServer>();
           s->node = std::make_unique<node::ServerNode>(o, StoreOpts(rule, learning_rate));
           s->node->SetCallbacks(QueueCallbacks(s->events));
           return s;
         }), py::arg("rule") = "sum", py::arg("learning_rate") = 0.01f)
      .def("register_handler", [](PyServer& s, const std::string& name, py::function fn) {
        s.get().RegisterHandler(name, PythonHandler(std::move(fn)));
      }, py::arg("name"), py::arg("fn"))
      .def_property_readonly("streamed_pushes", [](PyServer& s) { return s.get().streamed_pushes(); });
  BindNodeCommon(server);

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

  py::class_<PyRankTables>(m, "RankTables")
      .def(py::init([](int scheduler_port, const std::string& scheduler_host, const std::string& job_id,
                       const std::string& role, double timeout, double reconnect_for,
                       const std::string& cluster_token, const std::string& tls_cert, const std::string& tls_key,
                       const std::string& tls_ca) {
             node::RankTableSubscriberOptions o;
             o.tls = LoadTls(comm::TlsFiles{tls_cert, tls_key, tls_ca});
             o.port = scheduler_port;
             o.host = scheduler_host;
             o.job_id = job_id;
             o.role = role;
             o.timeout = Seconds(timeout);
             o.reconnect_for = Seconds(reconnect_for);
             o.cluster_token = cluster_token;
             auto r = std::make_unique<PyRankTables>();
             std::shared_ptr<PyRankTables::Shared> sh = r->shared;
             r->sub = std::make_unique<node::RankTableSubscriber>(
                 o,
                 [sh](const pb::RankTableStream& t) {
                   {
                     std::lock_guard<std::mutex> lock(sh->mu);
                     if (sh->tables.size() >= 1024) sh->tables.pop_front();
                     sh->tables.push_back(t.ranktable());
                   }
                   sh->cv.notify_all();
                 },
                 [sh](const Status& why) {
                   {
                     std::lock_guard<std::mutex> lock(sh->mu);
                     sh->closed = true;
                     sh->why = why;
                   }
                   sh->cv.notify_all();
                 });
             Status st;
             {
               py::gil_scoped_release nogil;
               st = r->sub->Start();
             }
             Check(st);
             return r;
           }), py::arg("scheduler_port"), py::arg("scheduler_host") = "127.0.0.1", py::arg("job_id") = "default",
           py::arg("role") = "worker", py::arg("timeout") = 10.0, py::arg("reconnect_for") = 0.0,
           py::arg("cluster_token") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_ca") = "")
      .def("next", &PyRankTables::Next, py::arg("timeout") = -1.0)
      .def("close", [](PyRankTables& r) {
        if (!r.sub) return;
        {
          py::gil_scoped_release nogil;
          r.sub->Stop();
        }
        r.sub.reset();
        std::lock_guard<std::mutex> lock(r.shared->mu);
        r.shared->closed = true;
        r.shared->why = Status::Ok();  // closed by its user: iteration simply ends
      });

  struct PyAdmin {
    std::unique_ptr<node::AdminClient> c;
  };
  py::class_<PyAdmin>(m, "AdminClient")
      .def(py::init([](int scheduler_port, const std::string& scheduler_host, double timeout,
                       const std::string& cluster_token, const std::string& tls_cert, const std::string& tls_key,
                       const std::string& tls_ca) {
             node::AdminClientOptions o;
             o.tls = LoadTls(comm::TlsFiles{tls_cert, tls_key, tls_ca});
             o.scheduler_port = scheduler_port;
             o.scheduler_host = scheduler_host;
             o.timeout = Seconds(timeout);
             o.cluster_token = cluster_token;
             auto a = std::make_unique<PyAdmin>();
             a->c = std::make_unique<node::AdminClient>(o);
             Status st;
             {
               py::gil_scoped_release nogil;
               st = a->c->Connect();
             }
             Check(st);
             return a;
           }), py::arg("scheduler_port"), py::arg("scheduler_host") = "127.0.0.1", py::arg("timeout") = 10.0,
           py::arg("cluster_token") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_ca") = "")
      .def("admin", [](PyAdmin& a, const std::string& op, int worker_num, int server_num,
                       std::vector<std::string> node_ids) {
        pb::AdminRequest req;
        req.set_op(op);
        req.set_worker_num(worker_num);
        req.set_server_num(server_num);
        for (auto& id : node_ids) req.add_node_ids(id);
        Result<pb::AdminResponse> r = Status(Code::kInternal, "not run");
        {
          py::gil_scoped_release nogil;
          r = a.c->Admin(req);
        }
        if (!r.ok()) Raise(r.status());
        return AdminDict(r.value());
      }, py::arg("op"), py::arg("worker_num") = 0, py::arg("server_num") = 0,
         py::arg("node_ids") = std::vector<std::string>{})
      .def("close", [](PyAdmin& a) {
        py::gil_scoped_release nogil;
        a.c.reset();
      });
}
