// ParamStore: a server's built-in store of float tensors by uint64 key.
// Owned by the server node. Thread-safe: any thread may call any method; pushes
// to one key are applied atomically with respect to each other and to pulls of
// that key. Keys are spread over kStripes independently locked shards, so
// handlers on different executor threads rarely contend.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"

namespace pscore {
namespace core {

enum class UpdateRule { kAssign, kSum, kSgd };

class ParamStore {
  struct Stripe;

 public:
  struct Options {
    UpdateRule rule = UpdateRule::kSum;
    float learning_rate = 0.01f;
    // Streamed pushes (BeginStream): bytes of spare blocks kept for the next stream of a
    // key (a key larger than this is never streamed); how long a stream may make no
    // progress while another push waits for its key before it is revoked; and how long a
    // push waits for a stream that still makes progress (a sender trickling its bytes)
    // before it revokes it anyway.
    uint64_t stream_spare_bytes = 512ull << 20;
    std::chrono::milliseconds stream_stall{2000};
    std::chrono::milliseconds stream_hold{10000};
  };
  class PushStream;
  // A user rule: fold `incoming` (n floats) into `stored` (n floats). Called
  // with the key's shard lock held, so it must not call back into the store.
  using Updater = std::function<void(uint64_t key, float* stored, const float* incoming, size_t n)>;

  explicit ParamStore(Options opts);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Overrides the built-in rule for later pushes (an empty function restores it).
  void SetUpdater(Updater u);

  // Applies keys[i] with lens[i] floats taken back to back from `values`. A key
  // first pushed is created zero-filled with the pushed length, then the rule
  // is applied (assign: copy; sum: +=; sgd: w -= lr * g). A length that differs
  // from the stored length is refused for that key (nothing applied to it) and
  // the other keys are still applied; the returned kInvalidArgument names the
  // first refused key. Null arrays with a non-zero count are kInvalidArgument.
  Status Push(const uint64_t* keys, const uint32_t* lens, const float* values, size_t num_keys);

  // A push applied while its values arrive, for a server that reads a large push from
  // the socket piece by piece and folds each piece in while it is still in cache: the
  // keys' new values are computed into spare blocks (stored op incoming, with the
  // built-in rule) and replace the stored ones at Commit, one key at a time, so pulls see
  // a key before or after the push, never in between, and an uncommitted stream changes
  // nothing. While a stream holds a key, other pushes to it wait (a stream making no
  // progress for Options::stream_stall, or still holding the key after a push waited
  // Options::stream_hold for it, is revoked for them; its Commit then applies nothing and
  // returns kAborted) and no second stream takes it. Null when the push cannot stream: a user rule is
  // set, a key is missing or has another length, is held by a stream, or is larger than
  // Options::stream_spare_bytes; the caller then pushes the values whole with Push.
  //
  // A key's spare block is the block its last stream replaced (kept within
  // Options::stream_spare_bytes). A key without one gets a fresh, zero-filled block
  // (kAllocate), or, with kSparesOnly (a caller that must not stall on allocating and
  // zero-filling a large block: a server's loop thread), the stream is declined, and the
  // next Push of that key, on the caller's thread, prepares its spare (within the budget).
  enum class Targets { kAllocate, kSparesOnly };
  std::unique_ptr<PushStream> BeginStream(const uint64_t* keys, const uint32_t* lens, size_t num_keys,
                                          Targets targets = Targets::kAllocate);

  // For a caller about to Push under a lock of its own that a stream's progress may need
  // (the server's view lock, which its loop thread takes): waits, holding nothing, until
  // no stream holds any of the keys (pushed with lens: a key of another length is not
  // waited for, its push is refused anyway; a stalled stream is revoked as by Push), and
  // keeps new streams from starting on those keys' stripes until the hold is destroyed,
  // so the Push then never waits.
  class StreamHold {
   public:
    StreamHold() = default;
    StreamHold(StreamHold&& o) noexcept : stripes_(std::move(o.stripes_)) { o.stripes_.clear(); }
    StreamHold& operator=(StreamHold&&) = delete;
    ~StreamHold();

   private:
    friend class ParamStore;
    std::vector<Stripe*> stripes_;
  };
  StreamHold HoldStreamsOff(const uint64_t* keys, const uint32_t* lens, size_t num_keys);
  // Keys held by streams right now (any thread; a snapshot).
  uint64_t keys_held_by_streams() const { return held_keys_.load(std::memory_order_relaxed); }
  // Bytes of spare blocks kept for streams right now (a snapshot).
  uint64_t spare_bytes() const { return spare_bytes_.load(std::memory_order_relaxed); }

  // Writes each key's length to *lens and its floats back to back to *values
  // (both replaced). A missing key is kNotFound naming it; outputs are then empty.
  Status Pull(const uint64_t* keys, size_t num_keys, std::vector<uint32_t>* lens,
              std::vector<float>* values) const;

  // Pull in two steps, so a caller can copy straight into its own buffer: Lens writes
  // each key's length (kNotFound names a missing key); CopyValues, given those lens,
  // copies the floats back to back into out, which must hold their sum. A push never
  // changes a key's length, but Insert may replace a key in between (a migration, the
  // embedding program): CopyValues then answers kAborted and writes nothing past that
  // key's place; a key removed in between is kNotFound.
  Status Lens(const uint64_t* keys, size_t num_keys, uint32_t* lens) const;
  Status CopyValues(const uint64_t* keys, size_t num_keys, const uint32_t* lens, float* out) const;
  // Pull without a copy: out[i] is the stored memory of keys[i] (its length times 4 bytes),
  // pinned while the slice's owner is held. A push to a pinned key writes a fresh copy and
  // leaves the pinned memory alone, so a slice keeps the values of the moment it was taken
  // (a pull still sees every push applied before it). kNotFound names a missing key.
  Status ShareValues(const uint64_t* keys, size_t num_keys, Slice* out) const;

  // For scaling and migration: every entry whose ServerForKey(key, num_servers)
  // differs from `rank`, sorted by key, erased from the store when `erase`.
  // A rank outside [0, num_servers) owns nothing, so a leaving server gets all
  // of its entries. Returns nothing for num_servers <= 0.
  std::vector<std::pair<uint64_t, std::vector<float>>> ExtractNotOwned(int rank, int num_servers,
                                                                       bool erase);

  // True when some entry's ServerForKey(key, num_servers) differs from `rank`.
  bool HasNotOwned(int rank, int num_servers) const;

  // Stores `value` under `key`, replacing any previous value.
  void Insert(uint64_t key, std::vector<float> value);
  // Removes the given keys (missing ones are fine); returns how many were present.
  size_t Erase(const uint64_t* keys, size_t num_keys);
  void Clear();

  // Snapshots: exact when no other thread is writing.
  std::vector<uint64_t> Keys() const;
  size_t num_keys() const;
  size_t num_floats() const;

 private:
  static constexpr int kStripeBits = 6;
  static constexpr size_t kStripes = size_t{1} << kStripeBits;

  struct Block;
  using BlockPtr = std::shared_ptr<Block>;
  // A block kept for the next stream of its key, counted against stream_spare_bytes.
  class Spare {
   public:
    Spare() = default;
    Spare(BlockPtr block, std::atomic<uint64_t>* counter);
    Spare(Spare&& o) noexcept : block_(std::move(o.block_)), counter_(o.counter_) {}
    Spare& operator=(Spare&& o) noexcept;
    ~Spare() { Reset(); }
    BlockPtr Take();
    void Reset();
    const BlockPtr& block() const { return block_; }

   private:
    BlockPtr block_;
    std::atomic<uint64_t>* counter_ = nullptr;
  };
  // One key's floats. Shared with the slices ShareValues handed out; while any is out
  // (readers > 0) the values are never written, only replaced by a fresh block.
  struct Block {
    explicit Block(std::vector<float> v) : values(std::move(v)) {}
    std::vector<float> values;
    std::atomic<uint32_t> readers{0};
    PushStream* writer = nullptr;  // the stream holding the key (stripe lock)
    Spare spare;                   // stripe lock
    bool wants_spare = false;      // a kSparesOnly stream was declined for lack of one (stripe lock)
  };
  using Entries = std::unordered_map<uint64_t, BlockPtr>;
  struct Stripe {
    mutable std::mutex mu;
    std::condition_variable released;  // a stream let go of a key of this stripe
    int waiters = 0;                   // pushes waiting for a stream to let go
    Entries entries;
  };
  // Waits (stripe lock held) until no stream holds `block`; revokes a stalled one.
  void WaitForWriter(std::unique_lock<std::mutex>& lock, Stripe& stripe, const BlockPtr& block);
  // The entry of `key` once no stream holds it (stripe lock held; the caller counts itself
  // in waiters); a key stored with another length than `len` is not waited for.
  Entries::iterator FindUnheld(std::unique_lock<std::mutex>& lock, Stripe& stripe, uint64_t key, uint32_t len);
  // The key's values to write (stripe lock held): a fresh copy if slices are out.
  static std::vector<float>& Writable(BlockPtr& block);
  // fn(i, block) for each key under its stripe's lock; kNotFound names the first missing.
  template <typename Fn>
  Status ForEachStored(const uint64_t* keys, size_t num_keys, Fn fn) const;

  Stripe& StripeFor(uint64_t key);
  const Stripe& StripeFor(uint64_t key) const;
  // Applies one key's update; kInvalidArgument on a length mismatch. *wants_spare: the
  // key asked for a spare block (Block::wants_spare), to be made by PrepareSpare.
  Status PushOne(const Updater* updater, uint64_t key, const float* incoming, uint32_t len, bool* wants_spare);
  // A zero-filled spare block for `key`, made outside the locks (within the budget).
  void PrepareSpare(uint64_t key, uint32_t len);
  // Keeps `target` (a block of stored's length that no entry holds: a stream's unused
  // target, or the block its commit replaced) as stored's spare, when stored has none and
  // the budget allows (stripe lock held).
  void KeepAsSpare(Block& stored, BlockPtr& target);
  void ApplyBuiltIn(float* stored, const float* incoming, size_t n) const;

  const Options opts_;
  std::atomic<uint64_t> spare_bytes_{0};
  std::atomic<uint64_t> held_keys_{0};  // blocks with a writer
  std::shared_ptr<const Updater> updater_;  // Accessed with std::atomic_load/store.
  std::array<Stripe, kStripes> stripes_;
};

// See ParamStore::BeginStream. Owned by one thread at a time (the one reading the push).
class ParamStore::PushStream {
 public:
  ~PushStream();  // without Commit: nothing is applied, the keys are let go
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  // Folds in the next `n` values of the push (keys in order, back to back). Values past
  // the keys' total are ignored (the caller checked the total before).
  void Apply(const float* values, size_t n);
  // Every value arrived: each key's new values replace the stored ones, all keys or none.
  // When a key was revoked for a waiting push (the stream stalled) or replaced meanwhile
  // (Insert, Erase), nothing is applied and the result is kAborted naming it: the push
  // may be sent again whole. Once Commit has begun no key is revoked.
  Status Commit();
  uint64_t floats_applied() const { return applied_; }

 private:
  friend class ParamStore;
  struct Key {
    uint64_t key;
    BlockPtr source;  // the stored block when the stream began (pinned: readers)
    BlockPtr target;  // source op incoming, replaces source at Commit
  };
  explicit PushStream(ParamStore* store) : store_(store) {}
  void Release();

  ParamStore* store_;
  std::vector<Key> keys_;
  size_t key_ = 0;          // key being filled
  uint64_t key_off_ = 0;    // floats of it filled
  uint64_t applied_ = 0;
  bool done_ = false;       // committed or released
  // Steady clock of the last Apply (or the start); kCommitting once Commit has begun.
  static constexpr int64_t kCommitting = INT64_MAX;
  std::atomic<int64_t> progress_ns_{0};
};

}  // namespace core
}  // namespace pscore
