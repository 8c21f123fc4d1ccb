// BarrierManager, what it shows and keeps: the list of rounds, and the round counter
// (the newest ended rounds a scheduler's state file keeps, restored after a restart).
#include "pscore/core/barrier_manager.h"

#include <algorithm>
#include <utility>

namespace pscore::core {

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

}  // namespace pscore::core
