#include "pscore/node/server/key_ownership.h"

#include <algorithm>

#include "pscore/core/key_range.h"

namespace pscore::node {

Status KeyOwnership::CheckOwnedOne(const uint64_t* keys, size_t num_keys) const {
  // The one server of a job owns every position (ServerForKey(key, 1) is 0): no hash per key.
  if (view_.n == 1 && view_.rank == 0) return Status::Ok();
  for (size_t i = 0; i < num_keys; ++i) {
    int owner = core::ServerForKey(keys[i], view_.n);
    if (owner != view_.rank) {
      return Status(Code::kAborted, "key " + std::to_string(keys[i]) + " is owned by server rank " +
                                        std::to_string(owner) + " of " + std::to_string(view_.n) + ", not " +
                                        std::to_string(view_.rank));
    }
  }
  return Status::Ok();
}

Status KeyOwnership::CheckOwned(const uint64_t* keys, size_t num_keys, bool as_primary,
                                std::vector<int>* backups) const {
  if (view_.n <= 0) return Status(Code::kAborted, "server " + node_id_ + " owns no keys yet");
  if (view_.replicas <= 1) return CheckOwnedOne(keys, num_keys);
  int last_range = -1;
  for (size_t i = 0; i < num_keys; ++i) {
    const int range = core::ServerForKey(keys[i], view_.n);
    if (range == last_range) continue;
    last_range = range;
    const int primary = core::PrimaryOf(range, view_.n, view_.replicas, view_.live);
    const bool ok =
        as_primary ? primary == view_.rank : core::HoldsRange(view_.rank, range, view_.n, view_.replicas);
    if (!ok && !as_primary && HeldBeforeSwitch(keys[i])) {
      last_range = -1;  // the next key's range is another question under this view
      continue;
    }
    if (!ok) {
      return Status(Code::kAborted, "key " + std::to_string(keys[i]) + " is of range " + std::to_string(range) + "/" +
                                        std::to_string(view_.n) + ", whose primary is server rank " +
                                        std::to_string(primary) + ", not " + std::to_string(view_.rank) +
                                        (as_primary ? "" : " (nor is it a replica)"));
    }
    if (backups != nullptr) AddBackups(range, backups);
  }
  return Status::Ok();
}

void KeyOwnership::AddBackups(int range, std::vector<int>* backups) const {
  for (int rank : core::ReplicaChain(range, view_.n, view_.replicas)) {
    // A resyncing replica gets the range's pushes too: its copy is being rebuilt.
    const size_t at = static_cast<size_t>(rank);
    const bool live =
        at >= view_.live.size() || view_.live[at] || (at < view_.resyncing.size() && view_.resyncing[at]);
    if (rank != view_.rank && live && std::find(backups->begin(), backups->end(), rank) == backups->end()) {
      backups->push_back(rank);
    }
  }
}

bool KeyOwnership::EveryRangeHeldElsewhere() const {
  if (view_.replicas <= 1 || view_.n <= 0 || view_.rank < 0) return false;
  for (int range = 0; range < view_.n; ++range) {
    if (!core::HoldsRange(view_.rank, range, view_.n, view_.replicas)) continue;
    bool elsewhere = false;
    for (int rank : core::ReplicaChain(range, view_.n, view_.replicas)) {
      const size_t at = static_cast<size_t>(rank);
      const bool live = at >= view_.live.size() || view_.live[at];
      const bool rebuilt = at < view_.resyncing.size() && view_.resyncing[at];
      elsewhere = elsewhere || (rank != view_.rank && live && !rebuilt);
    }
    if (!elsewhere) return false;
  }
  return true;
}

bool KeyOwnership::HeldBeforeSwitch(uint64_t key) const {
  if (prev_.n <= 0 || prev_.rank < 0 || prev_.replicas <= 1) return false;
  return core::HoldsRange(prev_.rank, core::ServerForKey(key, prev_.n), prev_.n, prev_.replicas);
}

bool KeyOwnership::Settle(KeyView view) {
  // A scale's switch (prev_ set) counts: ranges held before it are dropped now.
  const bool changed = view.rank != view_.rank || view.n != view_.n || view.live != view_.live ||
                       view.resyncing != view_.resyncing || prev_.n > 0;
  prev_ = KeyView();  // READY under this view: no primary applies under an older one
  view_ = std::move(view);
  ++settles_;
  return changed;
}

KeyView KeyOwnership::Switch(int rank, int n) {
  KeyView old = view_;
  if (old.replicas > 1 && old.n > 0) prev_ = old;
  view_.rank = rank;
  view_.n = n;
  if (old.replicas > 1) {
    // A replicated scale starts with every server live (the scheduler checks it); the
    // metadata of the READY cluster sets liveness again.
    view_.live.assign(static_cast<size_t>(std::max(n, 0)), 1);
    view_.resyncing.assign(static_cast<size_t>(std::max(n, 0)), 0);
  }
  return old;
}

void KeyOwnership::Adopt(int rank, int n, int replicas) {
  view_.rank = rank;
  view_.n = n;
  if (replicas > 0) view_.replicas = replicas;
}

}  // namespace pscore::node
