// TransportLedger: the counters and the queued-bytes account of one Transport, kept by its
// connections as they read and write. Owned by the Transport; loop thread only, except
// payload_bytes_copied() (any thread).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pscore/comm/transport_types.h"
#include "pscore/core/buffer.h"

namespace pscore::comm {

class TransportLedger {
 public:
  void CountIn(size_t bytes, size_t frames) {
    stats_.bytes_in += bytes;
    stats_.frames_in += frames;
  }
  // Per frame on the heartbeat path: an index and two adds, no lookup, no allocation.
  void CountOut(size_t bytes, int cmd) {
    stats_.bytes_out += bytes;
    ++stats_.frames_out;
    CommandStats& c = by_cmd_[CommandSlot(cmd)];
    ++c.frames_out;
    c.bytes_out += bytes;
  }
  void CountCommandIn(int cmd, uint64_t bytes) {
    CommandStats& c = by_cmd_[CommandSlot(cmd)];
    ++c.frames_in;
    c.bytes_in += bytes;
  }
  void CountProtocolError() { ++stats_.protocol_errors; }
  void CountIncompleteCapClosed() { ++stats_.incomplete_cap_closed; }
  void CountQueuedCapClosed(bool total) { ++(total ? stats_.total_queued_cap_closed : stats_.queued_cap_closed); }
  void CountCopied(uint64_t bytes) { copied_.fetch_add(bytes, std::memory_order_relaxed); }

  void AddQueuedTotal(uint64_t n) { stats_.queued_write_bytes += n; }
  void DropQueuedTotal(uint64_t n) { stats_.queued_write_bytes -= n; }
  // Queued-but-unwritten bytes of all open connections, a shared payload (Payload::shared)
  // once however many connections hold it.
  uint64_t queued_write_bytes() const { return stats_.queued_write_bytes; }
  // A shared payload's count in the total: HoldShared per connection that queues it (the
  // first adds its size), ReleaseShared when that frame is written or dropped (the last
  // removes it). The payload is alive while held: every holder's frame references it.
  bool HoldsShared(const Buffer* payload) const { return shared_.count(payload) != 0; }
  void HoldShared(const Buffer* payload) {
    if (shared_[payload]++ == 0) stats_.queued_write_bytes += payload->size();
  }
  void ReleaseShared(const Buffer* payload) {
    auto it = shared_.find(payload);
    if (it == shared_.end()) return;
    if (--it->second > 0) return;
    stats_.queued_write_bytes -= payload->size();
    shared_.erase(it);
  }
  size_t shared_payloads_queued() const { return shared_.size(); }

  // Open connections, the divisor of a connection's fair share of the total cap.
  size_t open_connections = 0;

  TransportStats& stats() { return stats_; }
  const TransportStats& stats() const { return stats_; }
  uint64_t payload_bytes_copied() const { return copied_.load(std::memory_order_relaxed); }
  // One entry per command number that carried a frame either way, in number order,
  // kOtherCommand (if any) last.
  std::vector<CommandStats> StatsByCommand() const {
    std::vector<CommandStats> out;
    for (size_t slot = 0; slot < by_cmd_.size(); ++slot) {
      const CommandStats& c = by_cmd_[slot];
      if (c.frames_in == 0 && c.frames_out == 0) continue;
      out.push_back(c);
      out.back().cmd = slot + 1 == by_cmd_.size() ? kOtherCommand : static_cast<int>(slot);
    }
    return out;
  }

 private:
  static size_t CommandSlot(int cmd) {
    return static_cast<unsigned>(cmd) < kCommandSlots - 1u ? static_cast<size_t>(cmd) : kCommandSlots - 1u;
  }

  TransportStats stats_;
  std::atomic<uint64_t> copied_{0};
  std::array<CommandStats, kCommandSlots> by_cmd_{};  // by CommandSlot; cmd fields unused
  // Queued frames referencing each shared payload, all connections.
  std::unordered_map<const Buffer*, uint64_t> shared_;
};

}  // namespace pscore::comm
