// pscore.Scheduler: the scheduler as pscore-node runs it, with its rank-table hub (native
// subscribers, RankTables) and, with http_port >= 0, its HTTP endpoint.
#include <memory>

#include "binding.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::python {
namespace {

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
    else if (k == "isolation_timeout") o.isolation_timeout = Seconds(v.cast<double>());
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

// wait_for_exit: blocks until the scheduler exits (the job ended), in slices.
void WaitForExit(PyScheduler& s, double timeout) {
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
    CheckSignals();
  }
}

}  // namespace

void BindScheduler(py::module_& m) {
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
      .def("wait_for_exit", &WaitForExit, py::arg("timeout"))
      .def("close", [](PyScheduler& s) {
        py::gil_scoped_release nogil;
        s.Close();
      });
}

}  // namespace pscore::python
