// SchedulerHttp's /metrics: the scheduler's Prometheus page (text format 0.0.4), built on
// the loop thread from the cluster, the coordination services, the links, the HTTP server,
// the rank-table hub and the admin counters. Families and their order are docs/http.md's.
#include <map>

#include "pscore/node/common/metrics_text.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_http.h"

namespace pscore::node {

namespace {

void AppendClusterMetrics(SchedulerNode* sched, MetricsText* m) {
  const core::ClusterManager& cluster = sched->cluster();
  m->Family("pscore_cluster_state", "gauge", "1 for the cluster's current state, 0 for the others.");
  const google::protobuf::EnumDescriptor* states = pb::ClusterState_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto* v = states->value(i);
    const std::string name = core::ClusterStateName(static_cast<pb::ClusterState>(v->number()));
    m->Sample("pscore_cluster_state", "state=\"" + name + "\"", v->number() == cluster.state() ? 1 : 0);
  }
  m->Family("pscore_membership_version", "gauge", "Membership epoch (bumped at every published topology).");
  m->Sample("pscore_membership_version", "", cluster.epoch());
  m->Family("pscore_nodes", "gauge", "Registered nodes by role and state.");
  std::map<std::pair<std::string, std::string>, uint64_t> nodes;
  for (const char* role : {"server", "worker"}) {
    for (const char* state : {"NODE_STARTING", "NODE_READY", "NODE_TIMED_OUT"}) nodes[{role, state}] = 0;
  }
  for (const core::NodeRecord* rec : cluster.Nodes()) {
    ++nodes[{RoleLabel(rec->role), pb::NodeState_Name(rec->state)}];
  }
  for (auto& [key, n] : nodes) {
    m->Sample("pscore_nodes", "role=\"" + key.first + "\",state=\"" + key.second + "\"", n);
  }
  m->Family("pscore_nodes_expected", "gauge", "Target number of nodes by role.");
  m->Sample("pscore_nodes_expected", "role=\"server\"", cluster.server_num());
  m->Sample("pscore_nodes_expected", "role=\"worker\"", cluster.worker_num());
  m->Family("pscore_heartbeats_received_total", "counter", "Heartbeats received by the scheduler.");
  m->Sample("pscore_heartbeats_received_total", "", sched->heartbeats());
  m->Family("pscore_state_writes_total", "counter",
            "State file (--state_dir) writes by result; after a failed one the state is written again each tick.");
  m->Sample("pscore_state_writes_total", "result=\"written\"", sched->state_writes());
  m->Sample("pscore_state_writes_total", "result=\"failed\"", sched->state_write_failures());
}

void AppendCoordinationMetrics(const SchedulerNode& sched, MetricsText* m) {
  const core::KvStore& kv = sched.kv();
  m->Family("pscore_kv_entries", "gauge", "Keys in the coordination key-value store.");
  m->Sample("pscore_kv_entries", "", kv.size());
  m->Family("pscore_kv_bytes", "gauge", "Bytes of keys and values in the key-value store.");
  m->Sample("pscore_kv_bytes", "", kv.total_bytes());
  m->Family("pscore_kv_bytes_limit", "gauge", "Cap on pscore_kv_bytes (--max_kv_total_mb, at most 1 GiB).");
  m->Sample("pscore_kv_bytes_limit", "", kv.max_total_bytes());
  m->Family("pscore_kv_gets_waiting", "gauge", "Blocking key-value gets waiting for their key.");
  m->Sample("pscore_kv_gets_waiting", "", kv.waiting());
  m->Family("pscore_barrier_ids", "gauge", "Barrier ids kept (a round waiting, or ended within 10 minutes).");
  m->Sample("pscore_barrier_ids", "", sched.barriers().ids());
}

}  // namespace

void SchedulerHttp::AppendConnectionMetrics(MetricsText* m) const {
  DCHECK(sched_->loop()->InLoopThread());
  const comm::TransportStats& t = sched_->transport_stats();
  AppendTransportMetrics(sched_->messenger().transport(), m);
  m->Family("pscore_connections", "gauge", "Open connections by protocol.");
  m->Sample("pscore_connections", "protocol=\"native\"", sched_->messenger().transport().num_connections());
  m->Sample("pscore_connections", "protocol=\"http\"", server_->num_connections());
  m->Family("pscore_connections_opened_total", "counter", "Connections opened by protocol.");
  m->Sample("pscore_connections_opened_total", "protocol=\"native\"", t.connections_opened);
  m->Sample("pscore_connections_opened_total", "protocol=\"http\"", server_->stats().connections_accepted);
  const comm::HttpServerStats& hs = server_->stats();
  m->Family("pscore_http_requests_total", "counter", "HTTP requests parsed.");
  m->Sample("pscore_http_requests_total", "", hs.requests);
  m->Family("pscore_http_bad_requests_total", "counter", "HTTP requests refused before routing (parse, size, time).");
  m->Sample("pscore_http_bad_requests_total", "", hs.bad_requests);
  m->Family("pscore_http_responses_total", "counter", "HTTP responses by status code.");
  for (auto& [code, n] : responses_) {
    m->Sample("pscore_http_responses_total", "code=\"" + std::to_string(code) + "\"", n);
  }
  m->Family("pscore_http_bytes_total", "counter", "HTTP bytes by direction.");
  m->Sample("pscore_http_bytes_total", "direction=\"in\"", hs.bytes_in);
  m->Sample("pscore_http_bytes_total", "direction=\"out\"", hs.bytes_out);
}

void SchedulerHttp::AppendRankTableMetrics(MetricsText* m) const {
  DCHECK(sched_->loop()->InLoopThread());
  const RankTableHubStats& rs = hub_->stats();
  m->Family("pscore_ranktable_subscribers", "gauge", "Rank-table subscribers by protocol.");
  // The two counts are updated at different moments (a dropped HTTP subscriber leaves the
  // hub before its connection's close callback runs; a stopped hub forgets every one), so
  // the hub may briefly hold fewer than http_subscribers_: never subtract past zero.
  const size_t all_subs = hub_->num_subscribers();
  m->Sample("pscore_ranktable_subscribers", "protocol=\"native\"",
            all_subs > http_subscribers_ ? all_subs - http_subscribers_ : 0);
  m->Sample("pscore_ranktable_subscribers", "protocol=\"http\"", http_subscribers_);
  m->Family("pscore_ranktable_version", "gauge", "Version of the current rank table.");
  m->Sample("pscore_ranktable_version", "", rs.versions);
  m->Family("pscore_ranktable_messages_total", "counter", "Rank-table messages sent to subscribers.");
  m->Sample("pscore_ranktable_messages_total", "", rs.sent);
  m->Family("pscore_ranktable_coalesced_total", "counter",
            "Tables replaced by a newer one before a slow subscriber got them.");
  m->Sample("pscore_ranktable_coalesced_total", "", rs.coalesced);
  m->Family("pscore_ranktable_dropped_total", "counter", "Subscribers dropped for not reading.");
  m->Sample("pscore_ranktable_dropped_total", "", rs.dropped);
}

void SchedulerHttp::AppendScaleMetrics(MetricsText* m) const {
  DCHECK(sched_->loop()->InLoopThread());
  m->Family("pscore_scale_operations_total", "counter", "Admin operations over HTTP by operation and outcome.");
  for (const AdminOpInfo& info : AdminOps()) {
    if (!info.http_post) continue;
    const std::string op = info.wire;
    for (const bool accepted : {true, false}) {
      auto it = scale_ops_.find({info.op, accepted});
      m->Sample("pscore_scale_operations_total",
                "op=\"" + op + "\",outcome=\"" + (accepted ? "accepted" : "refused") + "\"",
                it == scale_ops_.end() ? 0 : it->second);
    }
  }
  m->Family("pscore_scale_results_total", "counter", "Scale operations that ended, by result.");
  m->Sample("pscore_scale_results_total", "result=\"done\"", scales_done_);
  m->Sample("pscore_scale_results_total", "result=\"rolled_back\"", scales_rolled_back_);
}

void SchedulerHttp::ServeMetrics(comm::HttpConnId id) {
  DCHECK(sched_->loop()->InLoopThread());
  MetricsText m;
  AppendClusterMetrics(sched_, &m);
  AppendCoordinationMetrics(*sched_, &m);
  AppendConnectionMetrics(&m);
  AppendRankTableMetrics(&m);
  AppendScaleMetrics(&m);
  ++responses_[200];
  server_->Respond(id, 200, "text/plain; version=0.0.4", m.text()).IgnoreError();
}

}  // namespace pscore::node
