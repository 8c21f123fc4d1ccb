// pscore.RankTables: a rank-table subscription. The subscriber's callbacks (loop thread)
// queue the tables; Python takes them with next().
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include "binding.h"
#include "pscore/node/common/ranktable_subscriber.h"

namespace pscore::python {
namespace {

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

}  // namespace

void BindRankTables(py::module_& m) {
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
}

}  // namespace pscore::python
