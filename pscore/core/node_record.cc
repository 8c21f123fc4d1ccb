#include "pscore/core/node_record.h"

namespace pscore::core {

void ToServersMeta(const NodeRecord& rec, TimePoint now, Liveness liveness, pb::ServersMeta* out) {
  out->set_rank_id(rec.rank);
  out->set_ip(rec.ip);
  out->set_port(rec.port);
  out->set_is_alive(!rec.timed_out && (liveness == Liveness::kHeartbeat || !rec.resyncing));
  out->set_resyncing(rec.resyncing && !rec.timed_out);
  out->set_role(rec.role);
  out->set_node_id(rec.node_id);
  for (const pb::Device& d : rec.devices) *out->add_devices() = d;
  out->set_state(rec.state);
  out->set_incarnation(rec.incarnation);
  out->set_last_heartbeat_age_ms(ToMillis(now - rec.last_heartbeat));
}

void ToPersisted(const NodeRecord& rec, pb::PersistedNode* out) {
  out->set_node_id(rec.node_id);
  out->set_role(rec.role);
  out->set_rank(rec.rank);
  out->set_ip(rec.ip);
  out->set_port(rec.port);
  out->set_incarnation(rec.incarnation);
  for (const pb::Device& d : rec.devices) *out->add_devices() = d;
  out->set_host_name(rec.host_name);
  out->set_in_error(rec.in_error);
  out->set_error_code(rec.error_code);
  out->set_error_message(rec.error_message);
  out->set_finished(rec.finished);
  out->set_leaving(rec.leaving);
  out->set_timed_out(rec.timed_out);
  out->set_in_metadata(rec.in_metadata);
  out->set_resyncing(rec.resyncing);
}

NodeRecord FromPersisted(const pb::PersistedNode& n) {
  NodeRecord rec;
  rec.node_id = n.node_id();
  rec.role = n.role();
  rec.rank = n.rank();
  rec.ip = n.ip();
  rec.port = n.port();
  rec.incarnation = n.incarnation();
  rec.devices.assign(n.devices().begin(), n.devices().end());
  rec.host_name = n.host_name();
  rec.in_error = n.in_error();
  rec.error_code = n.error_code();
  rec.error_message = n.error_message();
  rec.finished = n.finished();
  rec.leaving = n.leaving();
  rec.timed_out = n.timed_out();
  rec.in_metadata = n.in_metadata();
  rec.resyncing = n.resyncing();
  return rec;
}

}  // namespace pscore::core
