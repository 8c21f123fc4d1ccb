// BarrierManager: the scheduler's named barriers, reusable in numbered rounds (generations).
// Owned by the scheduler node; not thread-safe: call every method from the scheduler's loop
// thread. Callbacks run synchronously at the end of the call that decides them (Arrive, Tick,
// Cancel, NodeFailed), after all state is updated, so a callback may call back in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/status.h"

namespace pscore::core {

enum class BarrierState { kWaiting, kPassed, kFailed, kCancelled };

// "waiting", "passed", "failed" or "cancelled".
const char* BarrierStateName(BarrierState state);

// One round of one barrier, as shown by `pscore-admin barriers`.
struct BarrierInfo {
  std::string id;
  uint64_t generation = 0;
  BarrierState state = BarrierState::kWaiting;
  size_t arrived = 0;
  size_t expected = 0;
  std::vector<std::string> missing;  // Participants not arrived yet, sorted.
  Status result;                     // OK while waiting and once passed.
};

// Bounds on what callers may hold in a BarrierManager. An owner is the caller's handle for a
// source of arrivals (the scheduler passes the connection id); owner 0 is not counted.
struct BarrierLimits {
  // Arrivals of one owner waiting at once (as KV blocking gets: 4096 per connection).
  size_t max_waiting_per_owner = 4096;
  // Waiting rounds one owner's arrivals opened.
  size_t max_rounds_per_owner = 1024;
  // Waiting rounds in total, whoever opened them.
  size_t max_rounds = 65536;
  // Ids kept with no round waiting (for late arrivals and retries); past this the one idle
  // longest is forgotten early.
  size_t max_ended_ids = 65536;
  // The longest timeout an Arrive may give; a longer one is refused with kInvalidArgument.
  Duration max_timeout = std::chrono::hours(24);
};

class BarrierManager {
 public:
  // Answers one Arrive. Called exactly once per Arrive.
  using Callback = std::function<void(Status)>;

  // How long a barrier id whose rounds have all ended is kept (for late and retried
  // arrivals) after its last activity, before Tick forgets it.
  static constexpr Duration kDefaultKeepEnded = std::chrono::minutes(10);

  // clock must outlive the manager. An id none of whose rounds waits, and that nobody has
  // arrived at for keep_ended, is forgotten: ids used once each (one per training step)
  // would otherwise each keep a round forever. Its next Arrive starts again at round 1.
  explicit BarrierManager(const Clock* clock, Duration keep_ended = kDefaultKeepEnded,
                          BarrierLimits limits = {});
  BarrierManager(const BarrierManager&) = delete;
  BarrierManager& operator=(const BarrierManager&) = delete;

  // node_id arrives at barrier id. generation 0 means "this node's next round": a node's k-th
  // Arrive on id belongs to generation k. A non-zero generation names the round explicitly, so
  // a retried Arrive (e.g. after a lost answer) gets that round's result instead of opening a
  // new one. The first arrival of a round fixes its participants (empty = the SetAllNodes set)
  // and its deadline (now + timeout); later callers' timeouts are ignored. A caller naming a
  // different set, or not in the set, fails the round at once for everyone. An arrival for a
  // round that already ended is answered at once with that round's result.
  // Refused at once, changing nothing: a timeout over limits.max_timeout (kInvalidArgument);
  // an owner with max_waiting_per_owner arrivals waiting, or an arrival that would open a
  // round past max_rounds_per_owner or max_rounds (kResourceExhausted).
  void Arrive(const std::string& id, const std::string& node_id, Duration timeout,
              std::vector<std::string> participants, Callback cb, uint64_t generation = 0,
              uint64_t owner = 0);

  // The owner is gone (its connection closed): each of its waiting arrivals is answered with
  // kCancelled and withdrawn. A node none of whose arrivals at a round still waits no longer
  // counts as arrived there, and its next Arrive on the id (generation 0) joins that round
  // again. The round's other waiters keep waiting; a round nobody waits at any more is
  // dropped as if never opened. Rounds the owner opened no longer count against it.
  void Withdraw(uint64_t owner);
  // Arrivals of owner waiting now.
  size_t waiting_of(uint64_t owner) const;

  // Waiting rounds of id end with kCancelled. kFailedPrecondition for an unknown id and if
  // no round of id is waiting (it passed, failed or was cancelled).
  [[nodiscard]] Status Cancel(const std::string& id);

  // Ends every waiting round of every id with `why` (which must not be OK), e.g. on shutdown.
  void CancelAll(const Status& why);

  // A node died, reported an error, left or shut down: every waiting round it takes part in
  // fails for all with kAborted naming it and reason, and so does every round that names it
  // later, at its first arrival, until NodeRecovered. The node's next Arrive on each id
  // joins a fresh round.
  void NodeFailed(const std::string& node_id, const std::string& reason);
  // The node is back (restarted, recovered, reset): rounds naming it may wait for it again.
  void NodeRecovered(const std::string& node_id);
  // Who is in the cluster: a round naming anyone else fails for all with kInvalidArgument.
  // Unset: every name is accepted.
  void SetMembership(std::function<bool(const std::string&)> is_member) { is_member_ = std::move(is_member); }

  // The "all nodes" set used by rounds whose first arrival gives no participants. Changing it
  // does not alter rounds already open.
  void SetAllNodes(std::vector<std::string> node_ids);

  // Fails with kTimeout every waiting round whose deadline is at or before now, and forgets
  // ids idle for keep_ended.
  void Tick();
  // Earliest deadline of a waiting round, so the owner can arm one timer instead of polling.
  std::optional<TimePoint> NextDeadline() const;

  // Every kept round, sorted by id then generation.
  std::vector<BarrierInfo> List() const;
  // Barrier ids kept (with a round waiting, or ended within keep_ended).
  size_t ids() const { return series_.size(); }

  // --- Round counter (callers count their calls per id; docs/coordination.md) ---
  // The newest ended round of one id and its result.
  struct EndedRound {
    std::string id;
    uint64_t round = 0;
    Status result;
    // The highest round of id each node joined, up to `round` (a round still waiting is not
    // kept over a restart): a restarted process resumes its count from it
    // (node::Node::ResumeBarrierRound). Sorted by node id.
    std::vector<std::pair<std::string, uint64_t>> joined;
  };
  // Per kept id, its newest ended round (for the scheduler's state file), sorted by id.
  std::vector<EndedRound> NewestEndedRounds() const;
  // A restarted scheduler: id's round `round` ended with result; a caller repeating it gets
  // that result, the next round opens fresh, a caller further ahead fails (kInternal).
  // `joined`: each node's highest round of id (EndedRound::joined; rounds above `round`
  // count as `round`). Ignored when id is already known.
  void RestoreEndedRound(const std::string& id, uint64_t round, Status result,
                         const std::vector<std::pair<std::string, uint64_t>>& joined = {});
  // The highest round of id node_id has joined and not withdrawn from (0: none kept); for a
  // node with no round kept since the id was restored (RestoreEndedRound), that restored round.
  uint64_t LastRoundOf(const std::string& id, const std::string& node_id) const;

 private:
  struct Round {
    std::vector<std::string> participants;  // Sorted, unique.
    bool all_nodes = false;                 // Opened with an empty participant list.
    TimePoint deadline;
    BarrierState state = BarrierState::kWaiting;
    Status result;
    std::set<std::string> arrived;
    struct Waiter {
      Callback cb;
      uint64_t owner = 0;
      std::string node_id;
    };
    std::vector<Waiter> waiting;
    uint64_t opener = 0;  // owner whose arrival opened the round (while it waits)
    bool restored = false;  // RestoreEndedRound: only its result is known
    std::string first;    // the first node to arrive (named when the round times out)
  };
  struct Series {
    std::map<std::string, uint64_t> last_generation;  // Highest generation each node joined.
    std::map<uint64_t, Round> rounds;
    uint64_t pruned_through = 0;  // Every completed round up to here has been dropped.
    std::optional<TimePoint> idle_since;  // set while no round waits (then in idle_)
  };
  using Answers = std::vector<std::pair<Callback, Status>>;

  // Why owner may not open one more round, or OK.
  Status CheckOpen(uint64_t owner) const;
  Round& OpenRound(const std::string& id, uint64_t gen, Duration timeout,
                   const std::vector<std::string>& participants, uint64_t owner,
                   Series* series);
  void JoinRound(const std::string& id, uint64_t gen, const std::string& node_id,
                 const std::vector<std::string>& participants, Callback cb, uint64_t owner,
                 Round* round, Answers* answers);
  // Withdraws owner's waiters from one waiting round; drops the round if none is left.
  void WithdrawFrom(const std::string& id, uint64_t gen, uint64_t owner, Series* series,
                    Answers* answers);
  // Forgets the ids idle longest while more than max_ended_ids are idle.
  void EvictIdle();
  // Why node_id with this participant list may not join round, or OK.
  Status CheckCaller(const std::string& id, uint64_t gen, const std::string& node_id,
                     const std::vector<std::string>& participants, const Round& round) const;
  // Why a round with these participants cannot pass: one not in the cluster, or failed.
  Status CheckParticipants(const std::string& id, uint64_t gen, const std::vector<std::string>& participants) const;
  // node_id calls again while its earlier call at the round waits: the earlier is answered
  // kCancelled and withdrawn, the new one is kept.
  void SupersedeEarlierCall(const std::string& id, uint64_t gen, const std::string& node_id, Round* round,
                            Answers* answers);
  static Status TimeoutStatus(const std::string& id, uint64_t gen, const Round& round);
  void Finish(const std::string& id, uint64_t gen, BarrierState state, Status result,
              Round* round, Answers* answers);
  // Drops completed rounds every participant has arrived for, keeping the newest one.
  static void Prune(Series* series);
  // After any change to id's rounds: marks it idle from now if no round waits, busy if one does.
  void Touch(const std::string& id, Series* series);
  static void Deliver(Answers* answers);
  // Round counter: why a caller naming round gen of a known id may not take part (it is
  // ahead of the round the manager is at: kInternal), or OK. An id with no round kept starts
  // at the caller's round.
  static Status CheckRound(const std::string& id, uint64_t gen, const std::string& node_id,
                           Series* series);

  static void Decrement(std::unordered_map<uint64_t, size_t>* counts, uint64_t owner);

  const Clock* clock_;
  const Duration keep_ended_;
  const BarrierLimits limits_;
  std::unordered_map<uint64_t, size_t> waiting_of_;  // owner -> its waiting arrivals
  std::unordered_map<uint64_t, size_t> opened_by_;   // owner -> waiting rounds it opened
  std::vector<std::string> all_nodes_;  // Sorted, unique.
  std::map<std::string, std::string> failed_;  // node -> why, between NodeFailed and NodeRecovered
  std::function<bool(const std::string&)> is_member_;
  std::map<std::string, Series> series_;
  std::set<std::tuple<TimePoint, std::string, uint64_t>> deadlines_;  // Waiting rounds only.
  std::set<std::pair<TimePoint, std::string>> idle_;  // (idle_since, id) of ids with no round waiting
};

}  // namespace pscore::core
