// RankTableHub: the scheduler's live rank table and its subscribers.
// Rebuilds the `global-ranktable` JSON (core::BuildRankTable) on every cluster event and
// registration, and pushes each new complete version to every subscriber: native ones
// (SUBSCRIBE_RANKTABLE / RANKTABLE_STREAM) and any other Sink (the HTTP stream).
// A subscriber whose connection holds more than coalesce_bytes unsent keeps only the newest
// table; one stuck above that bound for stall_timeout is dropped with a log line.
// Publisher registration (ClusterD's Register(jobId, role)): Register gives the job a
// registration id; a subscription may name it, and the next Register of the job ends
// every stream under the earlier one with kAborted naming both registrations. A
// subscription naming no registration is anonymous and no Register touches it.
// Owned next to the SchedulerNode (which must outlive it); loop thread only except
// Start/Stop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "pscore/comm/alive.h"
#include "pscore/core/rank_table.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

// One published version of the table, shared by every subscriber that sends it.
struct RankTableSnapshot {
  uint64_t version = 0;  // 1, 2, ... per published (complete) table
  std::string job_id;
  std::string table;                        // the global-ranktable JSON text
  BufferPtr native;                         // serialized pb::RankTableStream
  std::shared_ptr<const std::string> line;  // {"jobId":..,"rankTable":..}\n for HTTP
};

struct RankTableHubOptions {
  uint64_t coalesce_bytes = 256 << 10;
  Duration stall_timeout = std::chrono::seconds(30);
  Duration check_period = std::chrono::milliseconds(10);
};

struct RankTableHubStats {
  uint64_t versions = 0;         // tables published
  uint64_t sent = 0;             // messages handed to subscribers
  uint64_t coalesced = 0;        // tables replaced by a newer one before being sent
  uint64_t dropped = 0;          // subscribers dropped for stalling
  uint64_t refused = 0;          // subscriptions refused (unknown job, bad request)
  uint64_t subscribed = 0;       // subscriptions accepted
  uint64_t registrations = 0;    // publisher registrations accepted
  uint64_t superseded = 0;       // streams ended by a later registration of their job
};

// Bounds on the names a subscriber or publisher sends (bytes).
constexpr size_t kMaxRankTableJobIdBytes = 256;
constexpr size_t kMaxRankTableRoleBytes = 256;

class RankTableHub {
 public:
  // A subscriber's way out. The functions are called on the loop thread.
  struct Sink {
    std::string label;  // for logs: "native conn 7", "http conn 3"
    std::string role;
    uint64_t registration = 0;  // the publisher registration it follows; 0: anonymous
    std::function<uint64_t()> queued_bytes;
    std::function<Status(const RankTableSnapshot&)> send;
    std::function<void(const Status& why)> drop;  // close the subscriber's connection
    // Send the stream's final status (why it ends), then close once that is written.
    std::function<void(const Status& why)> end;
  };

  RankTableHub(SchedulerNode* sched, RankTableHubOptions options = {});
  ~RankTableHub();
  RankTableHub(const RankTableHub&) = delete;
  RankTableHub& operator=(const RankTableHub&) = delete;

  // Any thread but the loop's: installs the command handler and listeners, builds the
  // first table. The scheduler must have been started.
  Status Start();
  // Any thread but the loop's: forgets every subscriber. Idempotent.
  void Stop();

  // Loop thread. OK for the scheduler's job (or an empty id); else kNotFound naming it
  // (kInvalidArgument for an id over kMaxRankTableJobIdBytes).
  Status CheckJob(const std::string& job_id) const;
  // Loop thread. Registers the job's publisher: a new registration id, and every stream
  // subscribed under the job's earlier registration ends with kAborted naming both.
  // kInvalidArgument for an empty or oversized job id or role, kNotFound for another job.
  Result<pb::RankTableRegistration> Register(const std::string& job_id, const std::string& role);
  // Loop thread. May a stream of `job_id` under `registration` start? CheckJob, then for a
  // registration other than 0: kNotFound naming the job when it has no registration (or
  // not that one yet), kAborted when a later registration superseded it.
  Status CheckSubscription(const std::string& job_id, uint64_t registration) const;
  uint64_t registration() const { return registration_; }  // the live one; 0: none
  std::shared_ptr<const RankTableSnapshot> current() const { return current_; }
  // Adds a subscriber and sends it the current table at once. Returns its id.
  uint64_t AddSubscriber(Sink sink);
  void RemoveSubscriber(uint64_t id);
  size_t num_subscribers() const { return subs_.size(); }
  const RankTableHubStats& stats() const { return stats_; }
  const std::string& job_id() const { return sched_->options().job_id; }

 private:
  struct Sub {
    Sink sink;
    std::shared_ptr<const RankTableSnapshot> held;  // newest table not yet sent
    TimePoint congested_since;
    bool congested = false;
  };

  void InstallOnLoop();
  void OnSubscribe(comm::ConnId conn, comm::Frame&& frame);
  void OnRegister(comm::ConnId conn, comm::Frame&& frame);
  void Rebuild();
  void RebuildSoon();
  void Deliver(uint64_t id, Sub* sub, const std::shared_ptr<const RankTableSnapshot>& snap);
  void CheckCongested();

  SchedulerNode* sched_;
  RankTableHubOptions options_;
  std::shared_ptr<const RankTableSnapshot> current_;
  std::map<uint64_t, Sub> subs_;
  std::set<comm::ConnId> native_conns_;  // connections subscribed natively (one each)
  std::set<uint64_t> congested_;
  uint64_t next_id_ = 1;
  // The job's live publisher registration (0: none yet) and the role it was made with.
  // One job per scheduler, so one live registration at most.
  uint64_t registration_ = 0;
  uint64_t next_registration_ = 1;
  std::string registration_role_;
  comm::TimerId check_timer_ = 0;
  bool rebuild_pending_ = false;
  bool started_ = false;
  bool stopped_ = false;
  comm::AliveToken alive_;  // guards listener callbacks
  core::RankTableVersions versions_;
  RankTableHubStats stats_;
};

}  // namespace pscore::node
