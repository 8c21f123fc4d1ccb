// Node: the coordination client (ready, finish, KV, barriers, errors, events), blocking
// and asynchronous, over the control calls of node_control_calls.cc.

#include "pscore/node/common/handoff.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/common/admin_ops.h"

namespace pscore::node {

using comm::Frame;

Status Node::WaitForReady(Duration timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout, [this] { return ready_seen_ || terminated_; })) {
      if (ready_seen_) return Status::Ok();
      return termination_.ok() ? Status(Code::kAborted, "the job ended before it was ready") : termination_;
    }
  }
  pb::AdminRequest req;
  req.set_op(AdminOpName(AdminOp::kStatus));
  Result<Frame> r = CallScheduler(pb::ADMIN, req, std::chrono::seconds(5));
  pb::AdminResponse resp;
  if (!r.ok() || !ParsePayload(*r, &resp).ok()) {
    return Status(Code::kTimeout, "cluster not ready after " + std::to_string(ToMillis(timeout)) +
                                      " ms (scheduler status unavailable)");
  }
  int missing_w = std::max(0, resp.worker_num() - resp.registered_workers());
  int missing_s = std::max(0, resp.server_num() - resp.registered_servers());
  return Status(Code::kTimeout, "cluster not ready after " + std::to_string(ToMillis(timeout)) +
                                    " ms: " + std::to_string(missing_w + missing_s) + " node(s) missing (" +
                                    std::to_string(missing_w) + " workers, " + std::to_string(missing_s) +
                                    " servers)");
}

Status Node::Finish(Duration timeout) {
  pb::FinishMessage msg;
  msg.set_node_id(options_.node_id);
  msg.set_timeout_ms(ToMillis(timeout));
  Result<Frame> r = CallScheduler(pb::FINISH, msg, timeout + std::chrono::seconds(2));
  return r.status();
}

Status Node::WaitForTermination(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return terminated_; })) {
    return Status(Code::kTimeout, "the job did not end within " + std::to_string(ToMillis(timeout)) + " ms");
  }
  return termination_;
}

namespace {

pb::KvRequest KvRequestFor(pb::KvRequest::Op op, const std::string& key) {
  pb::KvRequest req;
  req.set_op(op);
  req.set_key(key);
  return req;
}

// A SET's KvRequest, encoded with the value copied once, straight into the payload.
BufferPtr KvSetPayload(const std::string& key, const std::string& value, bool overwrite) {
  pb::KvRequest head = KvRequestFor(pb::KvRequest::SET, key);
  head.set_overwrite(overwrite);
  return ToBufferWithBytes(head, pb::KvRequest::kValueFieldNumber, value);
}

// The value of a GET or TRY_GET answer.
Result<std::string> KvValue(Result<Frame> r) {
  if (!r.ok()) return r.status();
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  return std::move(*resp.mutable_value());
}

}  // namespace

Status Node::KvSet(const std::string& key, const std::string& value, bool overwrite) {
  if (overwrite) {  // the same again ends in the same state: any way may send it
    return CallScheduler(pb::KV_REQUEST, KvSetPayload(key, value, overwrite), options_.request_timeout).status();
  }
  auto answer = std::make_shared<Handoff<Status>>();
  CHECK(!loop_->OnRunningLoop()) << "blocking pscore call on the loop thread";
  KvSetAsync(key, value, overwrite, [answer](Status st) { answer->Put(std::move(st)); });
  return answer->Take();  // answered by the messenger's deadline, a re-issue's end or Stop
}

Result<std::string> Node::KvGet(const std::string& key, Duration timeout) {
  pb::KvRequest req = KvRequestFor(pb::KvRequest::GET, key);
  req.set_timeout_ms(ToMillis(timeout));
  return KvValue(CallScheduler(pb::KV_REQUEST, req, timeout + std::chrono::seconds(2)));
}

Result<std::string> Node::KvTryGet(const std::string& key) {
  return KvValue(CallScheduler(pb::KV_REQUEST, KvRequestFor(pb::KvRequest::TRY_GET, key), options_.request_timeout));
}

void Node::KvSetAsync(const std::string& key, const std::string& value, bool overwrite,
                      std::function<void(Status)> done) {
  std::string kept = overwrite ? std::string() : value;  // only the check below needs it
  CallSchedulerReissuable(
      pb::KV_REQUEST, KvSetPayload(key, value, overwrite), options_.request_timeout,
      [this, key, value = std::move(kept), overwrite, done = std::move(done)](Result<Frame> r, bool reissued) {
        if (overwrite || !reissued || r.status().code() != Code::kAlreadyExists) return done(r.status());
        // A re-issued SET that must not overwrite may find the value its first send stored:
        // that is its own success, not a conflict.
        Status conflict = r.status();
        KvTryGetAsync(key, [value, conflict, done](Result<std::string> got) {
          done(got.ok() && *got == value ? Status::Ok() : conflict);
        });
      });
}

void Node::KvGetAsync(const std::string& key, Duration timeout, std::function<void(Result<std::string>)> done) {
  pb::KvRequest req = KvRequestFor(pb::KvRequest::GET, key);
  req.set_timeout_ms(ToMillis(timeout));
  CallSchedulerAsync(pb::KV_REQUEST, req, timeout + std::chrono::seconds(2),
                     [done = std::move(done)](Result<Frame> r) { done(KvValue(std::move(r))); });
}

void Node::KvTryGetAsync(const std::string& key, std::function<void(Result<std::string>)> done) {
  CallSchedulerAsync(pb::KV_REQUEST, KvRequestFor(pb::KvRequest::TRY_GET, key), options_.request_timeout,
                     [done = std::move(done)](Result<Frame> r) { done(KvValue(std::move(r))); });
}

Result<std::vector<std::pair<std::string, std::string>>> Node::KvList(const std::string& dir) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::LIST);
  req.set_key(dir);
  Result<Frame> r = CallScheduler(pb::KV_REQUEST, req, options_.request_timeout);
  if (!r.ok()) return r.status();
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& e : resp.entries()) out.emplace_back(e.key(), e.value());
  return out;
}

Status Node::KvDelete(const std::string& key) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::DELETE);
  req.set_key(key);
  return CallScheduler(pb::KV_REQUEST, req, options_.request_timeout).status();
}

namespace {

pb::BarrierRequest BarrierRequestFor(const std::string& id, Duration timeout, const std::string& node_id,
                                     const std::vector<std::string>& participants, uint64_t round) {
  pb::BarrierRequest req;
  req.set_round(round);
  req.set_id(id);
  req.set_timeout_ms(ToMillis(timeout));
  req.set_node_id(node_id);
  for (const auto& p : participants) req.add_participants(p);
  return req;
}

}  // namespace

uint64_t Node::NextBarrierRound(const std::string& id) {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  return ++barrier_rounds_[id];
}

uint64_t Node::BarrierRound(const std::string& id) const {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  auto it = barrier_rounds_.find(id);
  return it == barrier_rounds_.end() ? 0 : it->second;
}

Result<uint64_t> Node::ResumeBarrierRound(const std::string& id) {
  pb::BarrierRequest req;
  req.set_id(id);
  req.set_node_id(options_.node_id);
  req.set_query_round(true);
  Result<Frame> r = CallScheduler(pb::BARRIER, req, options_.request_timeout);
  if (!r.ok()) return r.status();
  pb::BarrierResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  std::lock_guard<std::mutex> lock(rounds_mu_);
  barrier_rounds_[id] = resp.generation();
  return static_cast<uint64_t>(resp.generation());
}

Status Node::Barrier(const std::string& id, Duration timeout, std::vector<std::string> participants) {
  pb::BarrierRequest req = BarrierRequestFor(id, timeout, options_.node_id, participants, NextBarrierRound(id));
  return CallScheduler(pb::BARRIER, req, timeout + std::chrono::seconds(2)).status();
}

void Node::BarrierAsync(const std::string& id, Duration timeout, std::vector<std::string> participants,
                        std::function<void(Status)> done) {
  pb::BarrierRequest req = BarrierRequestFor(id, timeout, options_.node_id, participants, NextBarrierRound(id));
  CallSchedulerAsync(pb::BARRIER, req, timeout + std::chrono::seconds(2),
                     [done = std::move(done)](Result<Frame> r) { done(r.status()); });
}

Status Node::CancelBarrier(const std::string& id) {
  pb::BarrierRequest req;
  req.set_id(id);
  req.set_cancel(true);
  req.set_node_id(options_.node_id);
  return CallScheduler(pb::BARRIER, req, options_.request_timeout).status();
}

Status Node::ReportError(int code, const std::string& message) {
  pb::ErrorReport req;
  req.set_node_id(options_.node_id);
  req.set_error_code(code);
  req.set_message(message);
  return CallScheduler(pb::REPORT_ERROR, req, options_.request_timeout).status();
}

Status Node::SendEvent(uint32_t event, const std::string& payload) {
  pb::EventMessage req;
  req.set_event(event);
  req.set_node_id(options_.node_id);
  req.set_payload(payload);
  return CallScheduler(pb::SEND_EVENT, req, options_.request_timeout).status();
}

}  // namespace pscore::node
