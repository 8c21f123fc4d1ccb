// BarrierManager, rounds ended from outside (a closed connection, cancel, a failed node,
// a deadline) and the keeping of ids: pruning ended rounds, forgetting idle ids.
#include "pscore/core/barrier_manager.h"

#include <algorithm>
#include <tuple>

#include <glog/logging.h>

namespace pscore::core {

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

}  // namespace pscore::core
