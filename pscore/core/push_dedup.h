// PushDedup: which pushes a server has applied, by push id, so that a push a worker sends
// again (its answer was lost with a link, or the server restarted) is applied at most once.
// Owned by the ServerNode; any thread (one internal lock).
//
// A push id is (writer, incarnation, seq): the worker's node id, a number fresh per worker
// process start, and a per-process sequence that grows with every push part it sends.
// Per writer the window keeps the current incarnation's newest kWindow applied seqs, plus
// the seqs being applied right now. A writer seen with another incarnation starts a new
// window (that worker process restarted; its earlier pushes were answered or lost with
// it). A seq at or below the window's floor (the largest seq evicted from it) cannot be
// told apart from one applied: it is refused (kTooOld), never applied. At most
// kMaxWriters writers are tracked; pushes of further writers are refused (kFull).
//
// Snapshot (a server journal's kDedup record), little-endian:
//   | writers u32 | per writer: | id_len u16 | id | incarnation u64 | floor u64 |
//   | count u32 | seq u64 * count |
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "pscore/core/status.h"

namespace pscore::core {

struct PushId {
  std::string writer;
  uint64_t incarnation = 0;
  uint64_t seq = 0;         // >= 1
  uint64_t origin_seq = 0;  // the part it was split from (wire PushId.origin_seq); 0: none
};

// "writer/incarnation/seq", for messages.
std::string ToString(const PushId& id);

class PushDedup {
 public:
  static constexpr size_t kWindow = 4096;        // applied seqs kept per writer
  static constexpr size_t kMaxWriters = 4096;    // writers tracked at once
  static constexpr size_t kMaxWriterBytes = 256;  // of a writer's id (wire-checked)

  enum class Verdict {
    kApply,     // new: apply it, then call End
    kApplied,   // applied already: acknowledge without applying
    kInFlight,  // being applied by another request right now: answer "retry"
    kTooOld,    // at or below the window's floor: unknown, refused
    kFull,      // a new writer past kMaxWriters: refused
  };

  // Claims `id` when it is new (kApply). Every kApply is followed by exactly one End.
  Verdict Begin(const PushId& id);
  // The claimed push was applied (`applied`) or not (then it may come again).
  void End(const PushId& id, bool applied);
  // Replay: `id` was applied (journal order).
  void MarkApplied(const PushId& id);

  std::string Encode() const;
  // Replaces the window by a snapshot; kInvalidArgument names what does not decode.
  Status Decode(std::string_view bytes);
  // Adds a snapshot's applied ids to the window (a resyncing server installs the window
  // of each range's primary: docs/reliability.md). Per writer: a writer new here, or seen
  // here with a smaller incarnation, takes the snapshot's window; the same incarnation
  // gets the union (floor the larger of the two, then the newest kWindow seqs kept); a
  // snapshot with a smaller incarnation adds nothing. Nothing changes on a decode error.
  Status Merge(std::string_view bytes);

  size_t writers() const;
  // Whether `id` is in the window as applied (tests).
  bool Applied(const PushId& id) const;

 private:
  struct Writer {
    uint64_t incarnation = 0;
    uint64_t floor = 0;
    std::set<uint64_t> applied;
    std::set<uint64_t> in_flight;
  };
  // The writer's window for id's incarnation (a new incarnation starts afresh); null when
  // the writer is new and kMaxWriters are tracked.
  Writer* WindowFor(const PushId& id);
  static void Insert(Writer* w, uint64_t seq);
  using Windows = std::map<std::string, Writer, std::less<>>;
  static Status DecodeInto(std::string_view bytes, Windows* out);

  mutable std::mutex mu_;
  Windows writers_;
};

}  // namespace pscore::core
