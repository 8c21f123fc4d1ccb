// The scheduler refuses an AdminRequest carrying a field its operation does not take,
// whichever way it came (native ADMIN here; HTTP in http_test.cc).
#include <future>
#include <memory>

#include "pscore/node/common/admin_ops.h"
#include "pscore/node/scheduler/scheduler_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

pb::AdminRequest Req(const std::string& op, int workers, int servers, std::vector<std::string> ids = {}) {
  pb::AdminRequest r;
  r.set_op(op);
  r.set_worker_num(workers);
  r.set_server_num(servers);
  for (auto& id : ids) r.add_node_ids(id);
  return r;
}

TEST_CASE("admin fields: each operation takes only its own fields, named when refused", "[node]") {
  for (const char* op : {"stop", "status", "nodes", "enable", "disable", "new_instance", "barriers", "reset"}) {
    Status st = CheckAdminFields(Req(op, 3, 0));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("'worker_num'") && Catch::Contains(op));
    CHECK(CheckAdminFields(Req(op, 0, 2)).code() == Code::kInvalidArgument);
  }
  for (const char* op : {"stop", "status", "scale_out", "enable"}) {
    Status st = CheckAdminFields(Req(op, 0, 0, {"s0"}));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("'node_ids'"));
  }
  CHECK(CheckAdminFields(Req("scale_out", 2, 2)).ok());
  CHECK(CheckAdminFields(Req("scale_in", 1, 1)).ok());
  CHECK(CheckAdminFields(Req("scale_in", 0, 0, {"s0"})).ok());
  CHECK(CheckAdminFields(Req("reset", 0, 0, {"s0"})).ok());
  CHECK(CheckAdminFields(Req("stop", 0, 0)).ok());
}

TEST_CASE("admin fields: the scheduler refuses stop with worker_num and keeps running", "[node][net]") {
  SchedulerOptions o;
  o.worker_num = 1;
  o.server_num = 1;
  SchedulerNode sched(o);
  REQUIRE(sched.Start().ok());
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  const pb::AdminRequest req = Req("stop", 3, 0);
  sched.loop()->Post([&sched, req, p] { sched.Admin(req, [p](Status st, pb::AdminResponse) { p->set_value(st); }); });
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  Status st = f.get();
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("'worker_num'"));
  CHECK(sched.cluster_state() == pb::ClUSTER_STARTING);  // not CLUSTER_EXIT
  sched.Stop();
}

}  // namespace
}  // namespace pscore::node
