#include "pscore/node/scheduler/ranktable_hub.h"

#include <future>

#include <nlohmann/json.hpp>

#include "pscore/comm/http_server.h"
#include "pscore/core/rank_table.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

namespace {

// Timed-out nodes hold no live rank, so they leave the table until they come back.
std::vector<core::RankTableNode> TableNodes(const core::ClusterManager& cluster) {
  std::vector<core::RankTableNode> out;
  for (const core::NodeRecord* rec : cluster.Nodes()) {
    if (rec->timed_out) continue;
    out.push_back(core::RankTableNode{rec->node_id, rec->role, rec->rank, rec->ip, rec->host_name, rec->devices});
  }
  return out;
}

}  // namespace

RankTableHub::RankTableHub(SchedulerNode* sched, RankTableHubOptions options)
    : sched_(sched), options_(options) {}

RankTableHub::~RankTableHub() { Stop(); }

Status RankTableHub::Start() {
  if (started_) return Status(Code::kFailedPrecondition, "rank-table hub already started");
  if (!sched_->loop()->running()) return Status(Code::kFailedPrecondition, "scheduler loop not running");
  started_ = true;
  sched_->loop()->RunAndWait([this] { InstallOnLoop(); });
  return Status::Ok();
}

void RankTableHub::InstallOnLoop() {
  DCHECK(sched_->loop()->InLoopThread());
  comm::AliveToken::Watch alive = alive_.watch();
  SchedulerNode* sched = sched_;  // by value: the handler outlives a hub that stopped
  sched_->SetCommandHandler(pb::SUBSCRIBE_RANKTABLE, [this, alive, sched](comm::ConnId conn, comm::Frame&& frame) {
    if (!alive) {
      sched->messenger().Reply(conn, frame.meta, Status(Code::kUnavailable, "rank-table service stopped"))
          .IgnoreError();
      return;
    }
    OnSubscribe(conn, std::move(frame));
  });
  sched_->SetCommandHandler(pb::REGISTER_RANKTABLE, [this, alive, sched](comm::ConnId conn, comm::Frame&& frame) {
    if (!alive) {
      sched->messenger().Reply(conn, frame.meta, Status(Code::kUnavailable, "rank-table service stopped"))
          .IgnoreError();
      return;
    }
    OnRegister(conn, std::move(frame));
  });
  sched_->AddEventListener([this, alive](const core::Event&) {
    if (alive) RebuildSoon();
  });
  sched_->AddRegisterListener([this, alive] {
    if (alive) RebuildSoon();
  });
  Rebuild();
}

// Changes made while handling one batch of I/O (a burst of registrations, an event and
// the metadata it causes) are folded into one rebuild at the end of the loop iteration:
// building the table is O(nodes), so once per change would be O(nodes^2) for a job that
// registers all at once.
void RankTableHub::RebuildSoon() {
  DCHECK(sched_->loop()->InLoopThread());
  if (rebuild_pending_) return;
  rebuild_pending_ = true;
  comm::AliveToken::Watch alive = alive_.watch();
  sched_->loop()->RunBeforePoll([this, alive] {
    if (!alive) return;
    rebuild_pending_ = false;
    Rebuild();
  });
}

void RankTableHub::Stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  auto shutdown = [this] {
    alive_.Expire();
    // A stopped loop already cancelled every timer.
    if (check_timer_ != 0 && sched_->loop()->running()) sched_->loop()->CancelTimer(check_timer_);
    check_timer_ = 0;
    subs_.clear();
    congested_.clear();
  };
  sched_->loop()->RunAndWait(shutdown);
}

Status RankTableHub::CheckJob(const std::string& job_id) const {
  DCHECK(sched_->loop()->InLoopThread());
  if (job_id.empty() || job_id == this->job_id()) return Status::Ok();
  if (job_id.size() > kMaxRankTableJobIdBytes) {
    return Status(Code::kInvalidArgument, "jobId of " + std::to_string(job_id.size()) + " bytes (at most " +
                                              std::to_string(kMaxRankTableJobIdBytes) + ")");
  }
  return Status(Code::kNotFound, "unknown jobId '" + job_id + "': this scheduler serves job '" +
                                     this->job_id() + "'");
}

Result<pb::RankTableRegistration> RankTableHub::Register(const std::string& job_id, const std::string& role) {
  DCHECK(sched_->loop()->InLoopThread());
  if (job_id.empty()) return Status(Code::kInvalidArgument, "a rank-table registration needs a jobId");
  PSCORE_RETURN_IF_ERROR(CheckJob(job_id));
  if (role.size() > kMaxRankTableRoleBytes) {
    return Status(Code::kInvalidArgument, "role of " + std::to_string(role.size()) + " bytes (at most " +
                                              std::to_string(kMaxRankTableRoleBytes) + ")");
  }
  const uint64_t previous = registration_;
  registration_ = next_registration_++;
  const std::string previous_role = std::move(registration_role_);
  registration_role_ = role;
  ++stats_.registrations;
  LOG(INFO) << "rank table: job '" << job_id << "' registered its publisher (role '" << role << "'): registration "
            << registration_;
  if (previous != 0) {
    const Status why(Code::kAborted, "rank-table registration " + std::to_string(previous) + " of job '" + job_id +
                                         "' (role '" + previous_role + "') was superseded by registration " +
                                         std::to_string(registration_) + " (role '" + role + "')");
    std::vector<uint64_t> ended;
    for (auto& [id, sub] : subs_) {
      if (sub.sink.registration != 0 && sub.sink.registration != registration_) ended.push_back(id);
    }
    for (uint64_t id : ended) {
      Sink sink = std::move(subs_[id].sink);
      RemoveSubscriber(id);
      ++stats_.superseded;
      LOG(INFO) << "rank table: ending subscriber " << id << " (" << sink.label << "): " << why.message();
      if (sink.end) sink.end(why);
      else sink.drop(why);
    }
  }
  pb::RankTableRegistration out;
  out.set_jobid(this->job_id());
  out.set_role(role);
  out.set_registration(registration_);
  return out;
}

Status RankTableHub::CheckSubscription(const std::string& job_id, uint64_t registration) const {
  DCHECK(sched_->loop()->InLoopThread());
  PSCORE_RETURN_IF_ERROR(CheckJob(job_id));
  if (registration == 0 || registration == registration_) return Status::Ok();
  const std::string job = "job '" + this->job_id() + "'";
  if (registration_ == 0) {
    return Status(Code::kNotFound, job + " is not registered (no publisher registration since the scheduler "
                                         "started), so it has no registration " + std::to_string(registration));
  }
  if (registration < registration_) {
    return Status(Code::kAborted, "rank-table registration " + std::to_string(registration) + " of " + job +
                                      " was superseded by registration " + std::to_string(registration_));
  }
  return Status(Code::kNotFound, job + " has no registration " + std::to_string(registration) +
                                     " (its registration is " + std::to_string(registration_) + ")");
}

// Publishes complete tables only (the cluster READY: every member registered with its
// devices), each change once (core::RankTableVersions). While the membership is incomplete
// (starting, scaling, a member timed out) subscribers hear nothing and keep the last table.
void RankTableHub::Rebuild() {
  DCHECK(sched_->loop()->InLoopThread());
  const core::ClusterManager& cluster = sched_->cluster();
  const bool complete = cluster.state() == pb::CLUSTER_READY;
  if (!complete) return;
  std::string table = core::BuildRankTable(TableNodes(cluster), complete);
  const uint64_t version = versions_.Offer(complete, table);
  if (version == 0) return;
  auto snap = std::make_shared<RankTableSnapshot>();
  snap->version = version;
  stats_.versions = version;
  snap->job_id = job_id();
  snap->table = std::move(table);
  pb::RankTableStream msg;
  msg.set_jobid(snap->job_id);
  msg.set_ranktable(snap->table);
  msg.set_version(snap->version);
  snap->native = ToBuffer(msg);
  nlohmann::json line = {{"jobId", snap->job_id}, {"rankTable", snap->table}, {"version", snap->version}};
  snap->line = std::make_shared<const std::string>(comm::JsonText(line) + "\n");
  current_ = snap;
  LOG(INFO) << "rank table version " << snap->version << " (" << snap->table.size() << " bytes, epoch "
            << cluster.epoch() << ", " << core::ClusterStateName(cluster.state()) << ") to "
            << subs_.size() << " subscriber(s)";
  for (auto& [id, sub] : subs_) Deliver(id, &sub, current_);
}

uint64_t RankTableHub::AddSubscriber(Sink sink) {
  DCHECK(sched_->loop()->InLoopThread());
  uint64_t id = next_id_++;
  Sub& sub = subs_[id];
  sub.sink = std::move(sink);
  ++stats_.subscribed;
  VLOG(1) << "rank table: subscriber " << id << " (" << sub.sink.label << ", role '" << sub.sink.role << "')";
  if (current_) Deliver(id, &sub, current_);
  return id;
}

void RankTableHub::RemoveSubscriber(uint64_t id) {
  DCHECK(sched_->loop()->InLoopThread());
  subs_.erase(id);
  congested_.erase(id);
}

void RankTableHub::Deliver(uint64_t id, Sub* sub, const std::shared_ptr<const RankTableSnapshot>& snap) {
  DCHECK(sched_->loop()->InLoopThread());
  if (sub->sink.queued_bytes() > options_.coalesce_bytes) {
    if (sub->held) ++stats_.coalesced;
    sub->held = snap;
    if (!sub->congested) {
      sub->congested = true;
      sub->congested_since = SteadyClock().Now();
      congested_.insert(id);
    }
    if (check_timer_ == 0) {
      check_timer_ = sched_->loop()->AddTimer(options_.check_period, options_.check_period,
                                              [this] { CheckCongested(); });
    }
    return;
  }
  sub->held.reset();
  Status st = sub->sink.send(*snap);
  if (st.ok()) ++stats_.sent;
  else VLOG(1) << "rank table: send to " << sub->sink.label << " failed: " << st;
}

// Sends the held table to subscribers that drained; drops the ones stuck past the bound.
void RankTableHub::CheckCongested() {
  DCHECK(sched_->loop()->InLoopThread());
  TimePoint now = SteadyClock().Now();
  std::vector<uint64_t> ids(congested_.begin(), congested_.end());
  for (uint64_t id : ids) {
    auto it = subs_.find(id);
    if (it == subs_.end()) {
      congested_.erase(id);
      continue;
    }
    Sub& sub = it->second;
    if (sub.sink.queued_bytes() <= options_.coalesce_bytes) {
      sub.congested = false;
      congested_.erase(id);
      if (sub.held) {
        std::shared_ptr<const RankTableSnapshot> held = std::move(sub.held);
        Deliver(id, &sub, held);
      }
      continue;
    }
    if (now - sub.congested_since < options_.stall_timeout) continue;
    LOG(WARNING) << "rank table: dropping subscriber " << id << " (" << sub.sink.label << "): "
                 << sub.sink.queued_bytes() << " bytes unsent for " << ToMillis(now - sub.congested_since)
                 << " ms";
    ++stats_.dropped;
    Sink sink = std::move(sub.sink);
    RemoveSubscriber(id);
    sink.drop(Status(Code::kResourceExhausted, "rank-table subscriber stopped reading"));
  }
  if (congested_.empty() && check_timer_ != 0) {
    sched_->loop()->CancelTimer(check_timer_);
    check_timer_ = 0;
  }
}

void RankTableHub::OnSubscribe(comm::ConnId conn, comm::Frame&& frame) {
  DCHECK(sched_->loop()->InLoopThread());
  comm::Messenger& m = sched_->messenger();
  pb::ClientInfo info;
  Status st = ParsePayload(frame, &info);
  if (st.ok()) st = CheckSubscription(info.jobid(), info.registration());
  // One stream per connection, and a role that is a label: each subscription keeps a sink
  // and gets every table, so one connection repeating SUBSCRIBE must not multiply them.
  if (st.ok() && native_conns_.count(conn) != 0) {
    st = Status(Code::kAlreadyExists, "this connection already subscribes to the rank table");
  }
  if (st.ok() && info.role().size() > kMaxRankTableRoleBytes) {
    st = Status(Code::kInvalidArgument, "role of " + std::to_string(info.role().size()) + " bytes (at most " +
                                            std::to_string(kMaxRankTableRoleBytes) + ")");
  }
  if (!st.ok()) {
    ++stats_.refused;
    LOG(WARNING) << "rank table: refused subscription from " << m.transport().PeerAddress(conn) << ": " << st;
    m.Reply(conn, frame.meta, st).IgnoreError();
    return;
  }
  m.Reply(conn, frame.meta, Status::Ok()).IgnoreError();
  comm::Transport* t = &m.transport();
  Sink sink;
  sink.label = "native conn " + std::to_string(conn) + " " + t->PeerAddress(conn);
  sink.role = info.role();
  sink.queued_bytes = [t, conn] { return t->QueuedBytes(conn); };
  sink.send = [&m, conn](const RankTableSnapshot& snap) {
    return m.Notify(conn, MakeMeta(pb::RANKTABLE_STREAM, pb::SCHEDULER, 0), snap.native);
  };
  sink.registration = info.registration();
  sink.drop = [t, conn](const Status& why) { t->Close(conn, why); };
  // The final push carries the status (MessageMeta.status_code, error) and no table.
  sink.end = [&m, t, conn](const Status& why) {
    pb::MessageMeta meta = MakeMeta(pb::RANKTABLE_STREAM, pb::SCHEDULER, 0);
    meta.set_status_code(static_cast<int32_t>(why.code()));
    meta.set_error(why.message());
    m.Notify(conn, std::move(meta), nullptr).IgnoreError();
    t->CloseAfterFlush(conn, why);
  };
  uint64_t id = AddSubscriber(std::move(sink));
  native_conns_.insert(conn);
  comm::AliveToken::Watch alive = alive_.watch();
  t->WatchClose(conn, [this, alive, id, conn](const Status&) {
    if (!alive) return;
    native_conns_.erase(conn);
    RemoveSubscriber(id);
  });
}

void RankTableHub::OnRegister(comm::ConnId conn, comm::Frame&& frame) {
  DCHECK(sched_->loop()->InLoopThread());
  comm::Messenger& m = sched_->messenger();
  pb::ClientInfo info;
  Status st = ParsePayload(frame, &info);
  Result<pb::RankTableRegistration> reg = st.ok() ? Register(info.jobid(), info.role()) : Result<pb::RankTableRegistration>(st);
  if (!reg.ok()) {
    ++stats_.refused;
    LOG(WARNING) << "rank table: refused registration from " << m.transport().PeerAddress(conn) << ": "
                 << reg.status();
    m.Reply(conn, frame.meta, reg.status()).IgnoreError();
    return;
  }
  m.Reply(conn, frame.meta, *reg).IgnoreError();
}

}  // namespace pscore::node
