#include "pscore/core/barrier_manager.h"

#include <algorithm>

#include <glog/logging.h>

namespace pscore::core {
namespace {

// Long node lists are cut in messages: a 1000-node job must not produce megabyte errors.
constexpr size_t kMaxNamesInMessage = 16;

std::vector<std::string> SortedUnique(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// "w0, w1, w2" (or "w0, ..., w15 and 9 more").
std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxNamesInMessage; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > kMaxNamesInMessage) {
    out += " and " + std::to_string(names.size() - kMaxNamesInMessage) + " more";
  }
  return out;
}

TimePoint DeadlineAfter(TimePoint now, Duration timeout) {
  if (timeout >= TimePoint::max() - now) return TimePoint::max();
  return now + std::max(timeout, Duration::zero());
}

// "barrier b1" for the first round, "barrier b1 (generation 3)" after, so messages stay
// short in the common one-shot case yet say which round of a reused id failed.
std::string Name(const std::string& id, uint64_t gen) {
  if (gen <= 1) return "barrier " + id;
  return "barrier " + id + " (generation " + std::to_string(gen) + ")";
}

std::vector<std::string> Missing(const std::vector<std::string>& participants,
                                 const std::set<std::string>& arrived) {
  std::vector<std::string> missing;
  for (const std::string& p : participants) {
    if (arrived.count(p) == 0) missing.push_back(p);
  }
  return missing;
}

}  // namespace

const char* BarrierStateName(BarrierState state) {
  switch (state) {
    case BarrierState::kWaiting: return "waiting";
    case BarrierState::kPassed: return "passed";
    case BarrierState::kFailed: return "failed";
    case BarrierState::kCancelled: return "cancelled";
  }
  return "unknown";
}

BarrierManager::BarrierManager(const Clock* clock, Duration keep_ended, BarrierLimits limits)
    : clock_(clock), keep_ended_(keep_ended), limits_(limits) {
  CHECK(clock_ != nullptr);
}

void BarrierManager::SetAllNodes(std::vector<std::string> node_ids) {
  all_nodes_ = SortedUnique(std::move(node_ids));
}

size_t BarrierManager::waiting_of(uint64_t owner) const {
  auto it = waiting_of_.find(owner);
  return it == waiting_of_.end() ? 0 : it->second;
}

void BarrierManager::Decrement(std::unordered_map<uint64_t, size_t>* counts, uint64_t owner) {
  if (owner == 0) return;
  auto it = counts->find(owner);
  if (it == counts->end()) return;
  if (--it->second == 0) counts->erase(it);
}

Status BarrierManager::CheckOpen(uint64_t owner) const {
  if (deadlines_.size() >= limits_.max_rounds) {
    return Status(Code::kResourceExhausted, std::to_string(deadlines_.size()) +
                                                " barrier rounds already wait (the limit)");
  }
  auto it = opened_by_.find(owner);
  if (owner != 0 && it != opened_by_.end() && it->second >= limits_.max_rounds_per_owner) {
    return Status(Code::kResourceExhausted, std::to_string(it->second) +
                                                " barrier rounds opened on this connection "
                                                "already wait (the limit)");
  }
  return Status::Ok();
}

void BarrierManager::Arrive(const std::string& id, const std::string& node_id,
                            Duration timeout, std::vector<std::string> participants,
                            Callback cb, uint64_t generation, uint64_t owner) {
  // Refusals come first and change nothing: no id is created, no counter moves.
  if (timeout > limits_.max_timeout) {
    cb(Status(Code::kInvalidArgument,
              "barrier " + id + ": timeout " + std::to_string(ToMillis(timeout)) +
                  " ms is over the limit of " + std::to_string(ToMillis(limits_.max_timeout)) +
                  " ms"));
    return;
  }
  if (owner != 0 && waiting_of(owner) >= limits_.max_waiting_per_owner) {
    cb(Status(Code::kResourceExhausted, std::to_string(waiting_of(owner)) +
                                            " barrier arrivals already wait on this connection"));
    return;
  }
  participants = SortedUnique(std::move(participants));
  auto [found, created] = series_.try_emplace(id);
  Series& series = found->second;
  auto last_it = series.last_generation.find(node_id);
  const uint64_t last = last_it == series.last_generation.end() ? 0 : last_it->second;
  const uint64_t gen = generation != 0 ? generation : last + 1;

  if (generation != 0) {
    Status at = CheckRound(id, gen, node_id, &series);
    if (!at.ok()) {
      if (created) series_.erase(found);
      cb(std::move(at));
      return;
    }
  }
  auto it = series.rounds.find(gen);
  if (it == series.rounds.end() && gen > series.pruned_through) {
    Status room = CheckOpen(owner);
    if (!room.ok()) {
      if (created) series_.erase(found);
      cb(std::move(room));
      return;
    }
  }
  series.last_generation[node_id] = std::max(last, gen);
  if (it == series.rounds.end() && gen <= series.pruned_through) {
    Touch(id, &series);
    EvictIdle();
    cb(Status(Code::kFailedPrecondition,
              Name(id, gen) + " ended long ago; its result is no longer kept"));
    return;
  }
  Round& round = it != series.rounds.end()
                     ? it->second
                     : OpenRound(id, gen, timeout, participants, owner, &series);
  if (round.restored) {  // only its result survived a restart
    Touch(id, &series);
    cb(round.result);
    return;
  }
  Answers answers;
  JoinRound(id, gen, node_id, participants, std::move(cb), owner, &round, &answers);
  Prune(&series);
  Touch(id, &series);
  EvictIdle();
  Deliver(&answers);
}

BarrierManager::Round& BarrierManager::OpenRound(const std::string& id, uint64_t gen,
                                                 Duration timeout,
                                                 const std::vector<std::string>& participants,
                                                 uint64_t owner, Series* series) {
  Round& round = series->rounds[gen];
  round.all_nodes = participants.empty();
  round.participants = round.all_nodes ? all_nodes_ : participants;
  round.deadline = DeadlineAfter(clock_->Now(), timeout);
  round.opener = owner;
  if (owner != 0) ++opened_by_[owner];
  deadlines_.emplace(round.deadline, id, gen);
  return round;
}

Status BarrierManager::CheckCaller(const std::string& id, uint64_t gen,
                                   const std::string& node_id,
                                   const std::vector<std::string>& participants,
                                   const Round& round) const {
  if (round.participants.empty()) {
    return Status(Code::kFailedPrecondition,
                  Name(id, gen) + " has no participants: none were named and the node list "
                                  "is empty");
  }
  // An empty list means "all nodes": it matches a round opened the same way, and is compared
  // as the current node list against a round that named its participants.
  const std::vector<std::string>& given =
      participants.empty() ? (round.all_nodes ? round.participants : all_nodes_) : participants;
  if (is_member_) {
    for (const std::string& p : given) {
      if (!is_member_(p)) {
        return Status(Code::kInvalidArgument, Name(id, gen) + ": participant " + p + " is not in the cluster");
      }
    }
  }
  if (given != round.participants) {
    return Status(Code::kFailedPrecondition,
                  Name(id, gen) + ": participant set mismatch: " + node_id + " gave [" +
                      JoinNames(given) + "] but the first arrival fixed [" +
                      JoinNames(round.participants) + "]");
  }
  if (!std::binary_search(round.participants.begin(), round.participants.end(), node_id)) {
    return Status(Code::kInvalidArgument, Name(id, gen) + ": node " + node_id +
                                              " arrived but is not a participant [" +
                                              JoinNames(round.participants) + "]");
  }
  return Status::Ok();
}

Status BarrierManager::CheckParticipants(const std::string& id, uint64_t gen,
                                         const std::vector<std::string>& participants) const {
  for (const std::string& p : participants) {
    if (is_member_ && !is_member_(p)) {
      return Status(Code::kInvalidArgument, Name(id, gen) + ": participant " + p + " is not in the cluster");
    }
    auto failed = failed_.find(p);
    if (failed != failed_.end()) {
      return Status(Code::kAborted, Name(id, gen) + " failed: participant " + p + " failed: " + failed->second);
    }
  }
  return Status::Ok();
}

void BarrierManager::SupersedeEarlierCall(const std::string& id, uint64_t gen, const std::string& node_id,
                                          Round* round, Answers* answers) {
  std::vector<Round::Waiter> kept;
  for (Round::Waiter& w : round->waiting) {
    if (w.node_id != node_id) {
      kept.push_back(std::move(w));
      continue;
    }
    Decrement(&waiting_of_, w.owner);
    answers->emplace_back(std::move(w.cb), Status(Code::kCancelled, Name(id, gen) + ": " + node_id +
                                                                        " called again; this call is superseded"));
  }
  round->waiting = std::move(kept);
}

Status BarrierManager::TimeoutStatus(const std::string& id, uint64_t gen, const Round& round) {
  constexpr size_t kStragglersNamed = 3;
  std::vector<std::string> missing = Missing(round.participants, round.arrived);
  std::string names;
  for (size_t i = 0; i < missing.size() && i < kStragglersNamed; ++i) names += (i > 0 ? ", " : "") + missing[i];
  if (missing.size() > kStragglersNamed) names += " and " + std::to_string(missing.size() - kStragglersNamed) + " more";
  return Status(Code::kTimeout, Name(id, gen) + " timed out: " + std::to_string(round.arrived.size()) + "/" +
                                    std::to_string(round.participants.size()) + " arrived (first: " +
                                    (round.first.empty() ? "none" : round.first) + "), missing: " + names);
}

void BarrierManager::JoinRound(const std::string& id, uint64_t gen, const std::string& node_id,
                               const std::vector<std::string>& participants, Callback cb,
                               uint64_t owner, Round* round, Answers* answers) {
  Status check = CheckCaller(id, gen, node_id, participants, *round);
  if (round->state != BarrierState::kWaiting) {
    // A late or repeated caller of an ended round learns how it ended; a caller that could
    // never have joined it learns why, without changing the recorded result.
    answers->emplace_back(std::move(cb), check.ok() ? round->result : check);
    return;
  }
  // A waiting round cannot pass with a participant outside the cluster or failed: it ends
  // now for all rather than at its deadline.
  if (check.ok()) check = CheckParticipants(id, gen, round->participants);
  if (round->arrived.count(node_id) != 0) SupersedeEarlierCall(id, gen, node_id, round, answers);
  if (round->first.empty()) round->first = node_id;
  round->waiting.push_back(Round::Waiter{std::move(cb), owner, node_id});
  if (owner != 0) ++waiting_of_[owner];
  if (!check.ok()) {
    Finish(id, gen, BarrierState::kFailed, check, round, answers);
    return;
  }
  round->arrived.insert(node_id);
  if (round->arrived.size() == round->participants.size()) {
    Finish(id, gen, BarrierState::kPassed, Status::Ok(), round, answers);
  }
}

void BarrierManager::Finish(const std::string& id, uint64_t gen, BarrierState state,
                            Status result, Round* round, Answers* answers) {
  DCHECK(round->state == BarrierState::kWaiting);
  deadlines_.erase({round->deadline, id, gen});
  round->state = state;
  round->result = std::move(result);
  for (Round::Waiter& w : round->waiting) {
    Decrement(&waiting_of_, w.owner);
    answers->emplace_back(std::move(w.cb), round->result);
  }
  round->waiting.clear();
  Decrement(&opened_by_, round->opener);
  round->opener = 0;
}

void BarrierManager::Withdraw(uint64_t owner) {
  if (owner == 0 || (waiting_of_.count(owner) == 0 && opened_by_.count(owner) == 0)) return;
  // Newest round of an id first, so a node withdrawn from rounds k and k+1 steps its
  // counter back to k-1 and rejoins round k first.
  std::vector<std::pair<std::string, uint64_t>> rounds;
  for (const auto& [deadline, id, gen] : deadlines_) rounds.emplace_back(id, gen);
  std::sort(rounds.begin(), rounds.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  });
  Answers answers;
  for (const auto& [id, gen] : rounds) {
    Series& series = series_.at(id);
    WithdrawFrom(id, gen, owner, &series, &answers);
    Touch(id, &series);
  }
  EvictIdle();
  Deliver(&answers);
}

void BarrierManager::WithdrawFrom(const std::string& id, uint64_t gen, uint64_t owner,
                                  Series* series, Answers* answers) {
  Round& round = series->rounds.at(gen);
  if (round.opener == owner) {
    Decrement(&opened_by_, owner);
    round.opener = 0;
  }
  std::set<std::string> left;
  std::vector<Round::Waiter> kept;
  for (Round::Waiter& w : round.waiting) {
    if (w.owner != owner) {
      kept.push_back(std::move(w));
      continue;
    }
    Decrement(&waiting_of_, owner);
    left.insert(w.node_id);
    answers->emplace_back(std::move(w.cb),
                          Status(Code::kCancelled, Name(id, gen) + ": the connection that "
                                                   "arrived for " + w.node_id + " closed"));
  }
  round.waiting = std::move(kept);
  for (const std::string& node_id : left) {
    bool still = std::any_of(round.waiting.begin(), round.waiting.end(),
                             [&](const Round::Waiter& w) { return w.node_id == node_id; });
    if (still) continue;
    round.arrived.erase(node_id);
    auto last = series->last_generation.find(node_id);
    if (last != series->last_generation.end() && last->second == gen) last->second = gen - 1;
  }
  if (round.waiting.empty()) {
    // Nobody waits and nobody counts as arrived: the round is as if never opened.
    deadlines_.erase({round.deadline, id, gen});
    Decrement(&opened_by_, round.opener);
    series->rounds.erase(gen);
  }
}

void BarrierManager::EvictIdle() {
  while (idle_.size() > limits_.max_ended_ids) {
    series_.erase(idle_.begin()->second);
    idle_.erase(idle_.begin());
  }
}

void BarrierManager::Touch(const std::string& id, Series* series) {
  if (series->idle_since) idle_.erase({*series->idle_since, id});
  series->idle_since.reset();
  for (const auto& [gen, round] : series->rounds) {
    if (round.state == BarrierState::kWaiting) return;
  }
  series->idle_since = clock_->Now();
  idle_.emplace(*series->idle_since, id);
}

void BarrierManager::Prune(Series* series) {
  auto newest_done = series->rounds.end();
  for (auto it = series->rounds.begin(); it != series->rounds.end(); ++it) {
    if (it->second.state != BarrierState::kWaiting) newest_done = it;
  }
  for (auto it = series->rounds.begin(); it != newest_done;) {
    const Round& round = it->second;
    bool all_came = round.state != BarrierState::kWaiting;
    for (const std::string& p : round.participants) {
      auto last = series->last_generation.find(p);
      if (last == series->last_generation.end() || last->second < it->first) all_came = false;
    }
    if (!all_came) {
      ++it;
      continue;
    }
    series->pruned_through = std::max(series->pruned_through, it->first);
    it = series->rounds.erase(it);
  }
}

Status BarrierManager::Cancel(const std::string& id) {
  auto found = series_.find(id);
  if (found == series_.end() || found->second.rounds.empty()) {
    return Status(Code::kFailedPrecondition, "barrier " + id + " is unknown; nothing to cancel");
  }
  Series& series = found->second;
  Answers answers;
  bool cancelled_any = false;
  for (auto& [gen, round] : series.rounds) {
    if (round.state != BarrierState::kWaiting) continue;
    Finish(id, gen, BarrierState::kCancelled,
           Status(Code::kCancelled, Name(id, gen) + " cancelled"), &round, &answers);
    cancelled_any = true;
  }
  if (!cancelled_any) {
    // Prune keeps the newest ended round, so this names how the last round ended.
    const auto& [gen, round] = *series.rounds.rbegin();
    return Status(Code::kFailedPrecondition, Name(id, gen) + " already " +
                                                 BarrierStateName(round.state) +
                                                 "; nothing to cancel");
  }
  Prune(&series);
  Touch(id, &series);
  Deliver(&answers);
  return Status::Ok();
}

void BarrierManager::CancelAll(const Status& why) {
  CHECK(!why.ok()) << "CancelAll needs an error status";
  Answers answers;
  for (auto& [id, series] : series_) {
    bool ended = false;
    for (auto& [gen, round] : series.rounds) {
      if (round.state == BarrierState::kWaiting) {
        Finish(id, gen, BarrierState::kCancelled, why, &round, &answers);
        ended = true;
      }
    }
    Prune(&series);
    if (ended) Touch(id, &series);
  }
  Deliver(&answers);
}

void BarrierManager::NodeRecovered(const std::string& node_id) { failed_.erase(node_id); }

void BarrierManager::NodeFailed(const std::string& node_id, const std::string& reason) {
  failed_[node_id] = reason;
  Answers answers;
  for (auto& [id, series] : series_) {
    bool ended = false;
    for (auto& [gen, round] : series.rounds) {
      if (round.state != BarrierState::kWaiting ||
          !std::binary_search(round.participants.begin(), round.participants.end(),
                              node_id)) {
        continue;
      }
      Status failed(Code::kAborted, Name(id, gen) + " failed: participant " + node_id +
                                        " failed: " + reason);
      Finish(id, gen, BarrierState::kFailed, std::move(failed), &round, &answers);
      ended = true;
    }
    // A restarted node counts its arrivals from scratch; align it with the newest round so
    // its next Arrive joins the next fresh round instead of an old one.
    if (!series.rounds.empty()) {
      uint64_t& last = series.last_generation[node_id];
      last = std::max(last, series.rounds.rbegin()->first);
    }
    Prune(&series);
    if (ended) Touch(id, &series);
  }
  Deliver(&answers);
}

void BarrierManager::Tick() {
  TimePoint now = clock_->Now();
  Answers answers;
  while (!deadlines_.empty() && std::get<0>(*deadlines_.begin()) <= now) {
    auto [deadline, id, gen] = *deadlines_.begin();
    Series& series = series_.at(id);
    Round& round = series.rounds.at(gen);
    Finish(id, gen, BarrierState::kFailed, TimeoutStatus(id, gen, round), &round, &answers);
    Prune(&series);
    Touch(id, &series);
  }
  // Ids that ended and saw no arrival for keep_ended are forgotten.
  while (!idle_.empty() && now - idle_.begin()->first >= keep_ended_) {
    series_.erase(idle_.begin()->second);
    idle_.erase(idle_.begin());
  }
  Deliver(&answers);
}

std::optional<TimePoint> BarrierManager::NextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return std::get<0>(*deadlines_.begin());
}

std::vector<BarrierInfo> BarrierManager::List() const {
  std::vector<BarrierInfo> out;
  for (const auto& [id, series] : series_) {
    for (const auto& [gen, round] : series.rounds) {
      BarrierInfo info;
      info.id = id;
      info.generation = gen;
      info.state = round.state;
      info.arrived = round.arrived.size();
      info.expected = round.participants.size();
      info.missing = Missing(round.participants, round.arrived);
      info.result = round.result;
      out.push_back(std::move(info));
    }
  }
  return out;
}

Status BarrierManager::CheckRound(const std::string& id, uint64_t gen, const std::string& node_id,
                                  Series* series) {
  uint64_t newest = series->pruned_through;
  if (!series->rounds.empty()) newest = std::max(newest, series->rounds.rbegin()->first);
  if (newest == 0) {
    // Nothing kept (a new id, or one forgotten while idle): the caller's count rules.
    series->pruned_through = gen - 1;
    return Status::Ok();
  }
  if (gen <= newest + 1) return Status::Ok();
  return Status(Code::kInternal, Name(id, gen) + ": " + node_id + " is at round " + std::to_string(gen) +
                                     " but the service is at round " + std::to_string(newest) +
                                     " (the caller's round counter is ahead of the service)");
}

std::vector<BarrierManager::EndedRound> BarrierManager::NewestEndedRounds() const {
  std::vector<EndedRound> out;
  for (const auto& [id, series] : series_) {
    for (auto r = series.rounds.rbegin(); r != series.rounds.rend(); ++r) {
      if (r->second.state == BarrierState::kWaiting) continue;
      EndedRound ended{id, r->first, r->second.result, {}};
      for (const auto& [node_id, gen] : series.last_generation) {
        if (gen > 0) ended.joined.emplace_back(node_id, std::min(gen, r->first));
      }
      out.push_back(std::move(ended));
      break;
    }
  }
  return out;
}

void BarrierManager::RestoreEndedRound(const std::string& id, uint64_t round, Status result,
                                       const std::vector<std::pair<std::string, uint64_t>>& joined) {
  if (round == 0) return;
  auto [found, created] = series_.try_emplace(id);
  if (!created) return;
  Series& series = found->second;
  series.pruned_through = round - 1;
  for (const auto& [node_id, gen] : joined) {
    if (gen > 0) series.last_generation[node_id] = std::min(gen, round);
  }
  Round& r = series.rounds[round];
  r.restored = true;
  r.state = result.ok() ? BarrierState::kPassed : BarrierState::kFailed;
  r.result = std::move(result);
  Touch(id, &series);
  EvictIdle();
}

uint64_t BarrierManager::LastRoundOf(const std::string& id, const std::string& node_id) const {
  auto s = series_.find(id);
  if (s == series_.end()) return 0;
  auto last = s->second.last_generation.find(node_id);
  if (last != s->second.last_generation.end()) return last->second;
  // Restored after a restart, an id keeps its newest ended round (its result, not who
  // joined it). A node with no round of its own since is answered that round: a member of
  // the job before the restart had joined it (a restarted worker resumes from it), and any
  // node's next call joins the round after it, as a restarted node's does.
  for (auto r = s->second.rounds.rbegin(); r != s->second.rounds.rend(); ++r) {
    if (r->second.restored) return r->first;
  }
  return 0;
}

void BarrierManager::Deliver(Answers* answers) {
  // State is final before the first callback runs, so callbacks may re-enter the manager.
  for (auto& [cb, status] : *answers) cb(std::move(status));
  answers->clear();
}

}  // namespace pscore::core
