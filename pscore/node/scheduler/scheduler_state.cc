// SchedulerNode, restart recovery (--state_dir): loads the persisted state at Start, before
// the port is open, and writes a snapshot whenever membership, cluster state, epoch, the
// finish barrier, the KV store or a barrier round's end change. Snapshots are built and serialized on the loop
// thread and written by a StateWriter thread; the loop never waits on the disk.
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>

#include "pscore/core/state_file.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/scheduler/state_writer.h"

namespace pscore::node {

namespace {

// Reads and checks the state file; nullopt when there is nothing to restore.
Result<std::optional<pb::PersistedState>> LoadStateFile(const SchedulerOptions& o, const std::string& path) {
  Result<std::string> bytes = ReadStateFile(path);
  if (!bytes.ok()) {
    if (bytes.status().code() == Code::kNotFound) return std::optional<pb::PersistedState>();
    return bytes.status();
  }
  Result<pb::PersistedState> parsed = core::ParseState(*bytes);
  if (!parsed.ok()) {
    const std::string why = "state file " + path + " is damaged: " + parsed.status().message();
    if (!o.state_reset_on_corrupt) {
      return Status(parsed.status().code(), why + " (move it away, or pass --state_reset_on_corrupt to start fresh)");
    }
    const std::string aside = path + ".corrupt";
    std::rename(path.c_str(), aside.c_str());
    LOG(WARNING) << why << "; starting fresh (--state_reset_on_corrupt), the damaged file is kept as " << aside;
    return std::optional<pb::PersistedState>();
  }
  if (parsed->job_id() != o.job_id) {
    return Status(Code::kFailedPrecondition, "state file " + path + " belongs to job '" + parsed->job_id() +
                                                 "', this scheduler runs job '" + o.job_id + "'");
  }
  if (parsed->cluster_state() == pb::CLUSTER_EXIT) {
    LOG(INFO) << "state file " << path << " holds a job that ended; starting fresh";
    return std::optional<pb::PersistedState>();
  }
  return std::optional<pb::PersistedState>(std::move(*parsed));
}

}  // namespace

Status SchedulerNode::OpenState() {
  if (options_.state_dir.empty()) return Status::Ok();
  const std::string path = StateFilePath(options_.state_dir);
  Result<std::optional<pb::PersistedState>> loaded = LoadStateFile(options_, path);
  if (!loaded.ok()) return loaded.status();
  state_writer_ = std::make_unique<StateWriter>(path);
  // On the writer thread, never the loop's: Post, which reads no loop-thread state. On a
  // shared loop the closure may run after this node is gone: the token says so.
  state_writer_->SetOnWritten([this, token = writer_token_.watch()] {
    loop_->Post([this, token] {
      if (token) RunDurableAnswers(/*all=*/false);
    });
  });
  PSCORE_RETURN_IF_ERROR(state_writer_->Start());
  std::promise<Status> done;
  bool queued = loop_->Run([this, &loaded, &path, &done] {
    const std::optional<pb::PersistedState>& state = *loaded;
    if (state) {
      Status st = RestoreState(*state, path);
      if (!st.ok()) return done.set_value(st);
    } else {
      LOG(INFO) << "scheduler: no state to restore in " << options_.state_dir << "; starting fresh";
    }
    // Every cluster event, and every admission (none is reported while STARTING), is a change.
    listeners_.push_back([this](const core::Event&) { MarkStateDirty(/*urgent=*/true); });
    // An admission alone is not urgent: a node whose admission is lost registers again.
    register_listeners_.push_back([this] { MarkStateDirty(/*urgent=*/false); });
    if (owned_loop_) {
      // A clean stop writes what the writer had no time for (the writer drains at exit).
      loop_->AddStopHook([this] {
        MarkStateDirty(/*urgent=*/true);
        PersistState();
        RunDurableAnswers(/*all=*/true);
      });
    }
    MarkStateDirty(/*urgent=*/true);  // the first snapshot replaces an ended or damaged file
    DrainEvents();                    // applies the restore's events; persists
    done.set_value(Status::Ok());
  });
  if (!queued) return Status(Code::kCancelled, "the scheduler's event loop is stopping");
  return done.get_future().get();
}

Status SchedulerNode::RestoreState(const pb::PersistedState& state, const std::string& path) {
  DCHECK(loop_->InLoopThread());
  Status st = cluster_.Restore(state);
  if (!st.ok()) return Status(st.code(), "state file " + path + ": " + st.message());
  core::KvStore::Entries entries;
  for (const pb::KvEntry& e : state.kv()) entries.emplace_back(e.key(), e.value());
  kv_.Restore(entries);
  for (const pb::PersistedBarrier& b : state.barriers()) {
    std::vector<std::pair<std::string, uint64_t>> joined;
    for (const pb::PersistedBarrierJoin& j : b.joined()) joined.emplace_back(j.node_id(), j.round());
    barriers_.RestoreEndedRound(b.id(), b.round(), Status(static_cast<Code>(b.code()), b.message()), joined);
  }
  state_sequence_ = state.sequence();
  LOG(INFO) << "scheduler: restored from " << path << " (" << cluster_.Nodes().size() << " nodes, "
            << entries.size() << " KV entries, state " << core::ClusterStateName(cluster_.state()) << ", epoch "
            << cluster_.epoch() << "); nodes have until their heartbeat timeout to re-register";
  return Status::Ok();
}

uint64_t SchedulerNode::state_writes() const { return state_writer_ ? state_writer_->writes() : 0; }

uint64_t SchedulerNode::state_write_failures() const { return state_writer_ ? state_writer_->failures() : 0; }

// A snapshot the disk refused (full, read-only) is not lost for good: the next tick writes
// the state as it is then, and so on each tick until a write is done, so the file catches
// up once the disk has room even if nothing changes meanwhile.
void SchedulerNode::RetryRefusedState() {
  DCHECK(loop_->InLoopThread());
  if (!state_writer_) return;
  const uint64_t failures = state_writer_->failures();
  if (failures == state_failures_seen_) return;
  state_failures_seen_ = failures;
  MarkStateDirty(/*urgent=*/false);
}

void SchedulerNode::MarkStateDirty(bool urgent) {
  DCHECK(loop_->InLoopThread());
  if (!state_writer_) return;
  state_dirty_ = true;
  state_urgent_ = state_urgent_ || urgent;
}

// Membership and state changes are written at once (the writer coalesces). KV-only changes
// are written when the writer is idle, else at a later tick: a burst of KV sets costs one
// snapshot per disk write, not one per set.
void SchedulerNode::PersistState() {
  DCHECK(loop_->InLoopThread());
  if (!state_writer_ || !state_dirty_) return;
  if (!state_urgent_ && !state_writer_->idle()) return;
  pb::PersistedState st = cluster_.Snapshot();
  st.set_sequence(++state_sequence_);
  st.set_job_id(options_.job_id);
  st.set_written_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count());
  for (auto& [key, value] : kv_.Snapshot()) {
    pb::KvEntry* e = st.add_kv();
    e->set_key(key);
    e->set_value(value);
  }
  int joins = 0;
  for (const core::BarrierManager::EndedRound& r : barriers_.NewestEndedRounds()) {
    if (r.id.size() > core::kMaxStateBarrierIdBytes) continue;  // not kept over a restart
    pb::PersistedBarrier* b = st.add_barriers();
    b->set_id(r.id);
    b->set_round(r.round);
    b->set_code(static_cast<int>(r.result.code()));
    b->set_message(r.result.message().substr(0, core::kMaxStateBarrierMessageBytes));
    for (const auto& [node_id, round] : r.joined) {
      if (joins == core::kMaxStateBarrierJoins) break;  // those nodes resume from round 0
      if (node_id.size() > core::kMaxStateNodeIdBytes) continue;
      pb::PersistedBarrierJoin* j = b->add_joined();
      j->set_node_id(node_id);
      j->set_round(round);
      ++joins;
    }
  }
  state_writer_->Submit(core::SerializeState(st));
  state_dirty_ = false;
  state_urgent_ = false;
}

void SchedulerNode::AnswerWhenDurable(std::function<void()> answer) {
  DCHECK(loop_->InLoopThread());
  if (!state_writer_) return answer();
  PersistState();
  // Not submitted yet (a KV change waits for an idle writer or the next tick): the next one.
  const uint64_t needed = state_writer_->submitted() + (state_dirty_ ? 1 : 0);
  if (state_writer_->written_through() >= needed) return answer();
  durable_answers_.emplace_back(needed, std::move(answer));
}

void SchedulerNode::RunDurableAnswers(bool all) {
  DCHECK(loop_->InLoopThread());
  if (durable_answers_.empty() || !state_writer_) return;
  const uint64_t written = state_writer_->written_through();
  std::vector<std::function<void()>> ready;
  std::vector<std::pair<uint64_t, std::function<void()>>> kept;
  for (auto& [needed, answer] : durable_answers_) {
    if (all || needed <= written) {
      ready.push_back(std::move(answer));
    } else {
      kept.emplace_back(needed, std::move(answer));
    }
  }
  durable_answers_ = std::move(kept);
  for (auto& answer : ready) answer();
}

}  // namespace pscore::node
