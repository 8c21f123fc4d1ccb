// What every Python node object (Worker, Server) has: the C++ node, its event queue, the
// keepalive of caller buffers, and calls still running on their own thread (Finish) after
// an interrupted wait; and BindNodeCommon, which binds the methods of every role.
// Every method is called with the GIL held; blocking ones release it while they wait.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "events.h"
#include "pscore/core/role_names.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

namespace pscore::python {

template <typename N>
struct PyNode {
  std::unique_ptr<N> node;
  std::shared_ptr<EventQueue> events = std::make_shared<EventQueue>();
  Keeper keep;
  std::vector<std::shared_future<Status>> background;

  ~PyNode();
  N& get() {
    if (!node) Raise(Status(Code::kFailedPrecondition, "node is closed"));
    return *node;
  }
  void Start();
  void WaitReady(double timeout);
  // Runs a blocking C++ call on a thread of its own and waits for it interruptibly; an
  // interrupted call goes on until it ends (Stop ends it) and is joined at close.
  void Blocking(std::function<Status()> fn);
  void Finish(double timeout);
  void WaitForTermination(double timeout);
  void Close();

  // ---- control plane (the scheduler's KV, barriers, errors, events) ----
  void KvSet(const std::string& key, py::object value, bool overwrite);
  py::bytes KvGet(const std::string& key, double timeout);
  py::object KvTryGet(const std::string& key);
  py::list KvList(const std::string& dir);
  void KvDelete(const std::string& key);
  void Barrier(const std::string& id, double timeout, std::vector<std::string> participants);
  void CancelBarrier(const std::string& id);
  void ReportError(int code, const std::string& message);
  void SendEvent(uint32_t event, py::object payload);
};

using PyWorker = PyNode<node::WorkerNode>;
using PyServer = PyNode<node::ServerNode>;

// Runs fn (a call that returns a Status) with the GIL released, and raises its error.
template <typename F>
void CheckUnlocked(F&& fn) {
  Status st;
  {
    py::gil_scoped_release nogil;
    st = fn();
  }
  Check(st);
}

template <typename N>
PyNode<N>::~PyNode() {
  if (!node) return;
  py::gil_scoped_release nogil;
  node->Stop();
  for (auto& f : background) f.wait();
}

template <typename N>
void PyNode<N>::Start() {
  N& n = get();
  CheckUnlocked([&n] { return n.Start(); });
}

template <typename N>
void PyNode<N>::WaitReady(double timeout) {
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
    CheckSignals();
  }
}

template <typename N>
void PyNode<N>::Blocking(std::function<Status()> fn) {
  background.erase(std::remove_if(background.begin(), background.end(),
                                  [](const std::shared_future<Status>& f) {
                                    return f.wait_for(0s) == std::future_status::ready;
                                  }),
                   background.end());
  std::shared_future<Status> f = std::async(std::launch::async, std::move(fn)).share();
  background.push_back(f);  // joined at close even when the wait below is interrupted
  AwaitReady(f);
  Check(f.get());
}

template <typename N>
void PyNode<N>::Finish(double timeout) {
  N* n = &get();
  Duration t = Seconds(timeout);
  Blocking([n, t] { return n->Finish(t); });
}

template <typename N>
void PyNode<N>::WaitForTermination(double timeout) {
  N* n = &get();
  Duration t = Seconds(timeout);
  Blocking([n, t] { return n->WaitForTermination(t); });
}

template <typename N>
void PyNode<N>::Close() {
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

template <typename N>
void PyNode<N>::KvSet(const std::string& key, py::object value, bool overwrite) {
  std::string v = BytesOf(value);
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  get().KvSetAsync(key, v, overwrite, [p](Status st) { p->set_value(std::move(st)); });
  Check(Wait(f));
}

template <typename N>
py::bytes PyNode<N>::KvGet(const std::string& key, double timeout) {
  auto p = std::make_shared<std::promise<Result<std::string>>>();
  std::future<Result<std::string>> f = p->get_future();
  get().KvGetAsync(key, Seconds(timeout), [p](Result<std::string> r) { p->set_value(std::move(r)); });
  Result<std::string> r = Wait(f);
  if (!r.ok()) Raise(r.status());
  return py::bytes(r.value());
}

template <typename N>
py::object PyNode<N>::KvTryGet(const std::string& key) {
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

template <typename N>
py::list PyNode<N>::KvList(const std::string& dir) {
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

template <typename N>
void PyNode<N>::KvDelete(const std::string& key) {
  N& n = get();
  CheckUnlocked([&] { return n.KvDelete(key); });
}

template <typename N>
void PyNode<N>::Barrier(const std::string& id, double timeout, std::vector<std::string> participants) {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  get().BarrierAsync(id, Seconds(timeout), std::move(participants), [p](Status st) { p->set_value(std::move(st)); });
  Check(Wait(f));
}

template <typename N>
void PyNode<N>::CancelBarrier(const std::string& id) {
  N& n = get();
  CheckUnlocked([&] { return n.CancelBarrier(id); });
}

template <typename N>
void PyNode<N>::ReportError(int code, const std::string& message) {
  N& n = get();
  CheckUnlocked([&] { return n.ReportError(code, message); });
}

template <typename N>
void PyNode<N>::SendEvent(uint32_t event, py::object payload) {
  std::string s = BytesOf(payload);
  N& n = get();
  CheckUnlocked([&] { return n.SendEvent(event, s); });
}

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
      .def_property_readonly("server_count", [](P& p) { return p.get().server_num(); })
      .def_property_readonly("worker_count", [](P& p) { return p.get().metadata().worker_num(); })
      .def_property_readonly("cluster_state",
                             [](P& p) { return pb::ClusterState_Name(p.get().cluster_state()); })
      .def("node_ids", [](P& p, const std::string& role) {
             std::optional<pb::NodeRole> r = core::ParseRoleLabel(role);
             if (!r) Raise(Status(Code::kInvalidArgument, "role must be worker, server or scheduler"));
             return p.get().NodeIds(*r);
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

}  // namespace pscore::python
