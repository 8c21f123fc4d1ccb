// KeyOwnership: which keys this server serves. Its view of the key ranges (rank, server
// count, replicas, which replicas are live or being rebuilt) and, during a replicated
// scale, the view it held before its switch. Thread-safe through one reader-writer lock
// that callers hold across a check and the store change the check allows: a push holds it
// shared from its ownership check to its apply, and a switch takes it exclusively, so once
// a switch returns no request of a key given up is applied. Owned by ServerNode.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <string>
#include <vector>

#include "pscore/core/status.h"

namespace pscore::node {

struct KeyView {
  int rank = -1;
  int n = 0;         // servers, hence key ranges (0: owns nothing yet)
  int replicas = 1;  // copies of each range (the metadata's replicas)
  std::vector<char> live;       // by server rank: a live replica (the metadata's is_alive)
  std::vector<char> resyncing;  // by server rank: being rebuilt (forwarded to, not read)
};

class KeyOwnership {
 public:
  explicit KeyOwnership(std::string node_id) : node_id_(std::move(node_id)) {}

  std::shared_lock<std::shared_mutex> Share() const { return std::shared_lock<std::shared_mutex>(mu_); }
  std::unique_lock<std::shared_mutex> Exclusive() { return std::unique_lock<std::shared_mutex>(mu_); }

  // ---- the lock held, shared or exclusively ----
  const KeyView& view() const { return view_; }
  // Whether this server serves the keys: those whose range (ServerForKey(key, n)) it is
  // the primary of (`as_primary`), or whose range's replica chain it is in (a forwarded
  // push; also a range it held under the view before a scale's switch, until the view
  // settles). With one replica both are ServerForKey(key, n) == rank. When `backups` is
  // given, it gets the live (or resyncing) replicas of the keys' ranges other than this
  // one. kAborted when not: nothing applied, the worker sends it again under newer metadata.
  Status CheckOwned(const uint64_t* keys, size_t num_keys, bool as_primary = true,
                    std::vector<int>* backups = nullptr) const;

  // Whether every key range this server holds has another copy that serves it: a live
  // replica not being rebuilt (false with one replica).
  bool EveryRangeHeldElsewhere() const;
  // How many times the view settled: a scale whose switch runs after a Settle that came
  // once it started has ended (done or rolled back) without it, so that switch is stale.
  uint64_t settles() const { return settles_; }
  // ---- the lock held exclusively ----
  // The cluster is stable under `view`: it replaces the current one and the view before a
  // scale's switch is forgotten. True when anything changed (a switch counts).
  bool Settle(KeyView view);
  // A scale's switch to (rank, n); returns the view before it. With replicas every server
  // is live under the new view (a replicated scale starts so), and the old view keeps
  // counting for forwarded pushes until Settle.
  KeyView Switch(int rank, int n);
  // Takes (rank, n) as it is, for a server joining a scale (replicas <= 0: kept).
  void Adopt(int rank, int n, int replicas = 0);

 private:
  Status CheckOwnedOne(const uint64_t* keys, size_t num_keys) const;  // one replica
  void AddBackups(int range, std::vector<int>* backups) const;
  bool HeldBeforeSwitch(uint64_t key) const;

  const std::string node_id_;
  mutable std::shared_mutex mu_;
  KeyView view_;
  uint64_t settles_ = 0;
  // With replicas: the view this server held before it switched for a scale, kept until
  // the cluster is READY again (prev_.n 0: none). A primary that has not switched yet
  // applies a worker's push under that view and forwards it here: it is applied (the
  // primary's migration sends its entries to the new chain after the forward, on the same
  // link), so the push is acknowledged once, not refused and sent again under new ids.
  KeyView prev_;
};

}  // namespace pscore::node
