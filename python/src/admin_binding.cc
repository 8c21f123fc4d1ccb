// pscore.AdminClient: the scheduler's admin commands, as pscore-admin sends them.
#include <memory>

#include "binding.h"
#include "pscore/core/role_names.h"
#include "pscore/node/common/admin_client.h"

namespace pscore::python {
namespace {

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
    nd["role"] = core::RoleLabel(n.role());  // as pscore-admin nodes --json writes it
    nd["rank"] = n.rank_id();
    nd["host"] = n.ip();
    nd["port"] = n.port();
    nodes.append(nd);
  }
  d["nodes"] = nodes;
  return d;
}

}  // namespace

void BindAdminClient(py::module_& m) {
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

}  // namespace pscore::python
