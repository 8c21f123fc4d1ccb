// ParamStore: a server's built-in store of float tensors by uint64 key.
// Owned by the server node. Thread-safe: any thread may call any method; pushes
// to one key are applied atomically with respect to each other and to pulls of
// that key. Keys are spread over kStripes independently locked shards, so
// handlers on different executor threads rarely contend.
//
// Two layouts per shard (docs/design.md, "Inside the server's store"). Keys of up
// to kRunFloats floats live in runs: sorted arrays of keys with their values back to back
// (one length per run when all are equal), the runs ordered by first key. A batch is taken
// in windows, each grouped by shard, each shard locked once per window, and each key found
// by walking forward from the previous one (a sorted batch costs a step or two per key, no
// hash and no allocation); the keys a push creates are merged into the runs in bulk.
// Larger keys, and keys a slice or a stream holds (ShareValues, BeginStream move a key out
// of its run), are blocks of their own in a hash map, shared with the slices that read them.
#pragma once

#include <algorithm>
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

#include "pscore/core/buffer.h"
#include "pscore/core/row_lens.h"
#include "pscore/core/run_memory.h"
#include "pscore/core/status.h"
#include "pscore/core/update_rule.h"

namespace pscore {
namespace core {

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
    // Threads that take one batch of many keys (Push, Insert, Lens, CopyValues,
    // CopyUniform, ShareValues of at least 2 x kLaneKeys keys), each a share of the stripes
    // (a push or insert) or of the keys (a read), the caller's thread one of them: 0 picks
    // the machine's cores (at most kMostBatchThreads); 1 keeps every batch on the caller's
    // thread. Batches taken at the same time (in any store of the process) share them
    // (RunLanes).
    unsigned batch_threads = 0;
  };
  // A batch gets one thread for each kLaneKeys of its keys, or for each kLaneFloats of a
  // push's floats if that gives more, within Options::batch_threads.
  static constexpr size_t kLaneKeys = 64 * 1024;
  static constexpr uint64_t kLaneFloats = uint64_t{1} << 20;
  static constexpr unsigned kMostBatchThreads = 4;
  class PushStream;
  // A user rule: fold `incoming` (n floats) into `stored` (n floats). Called
  // with the key's shard lock held, so it must not call back into the store; called
  // on several threads at once for keys of different shards (concurrent pushes, and the
  // lanes of one batch of many keys: Options::batch_threads). An exception it throws ends
  // its lane of the batch there (keys the lane created and had not folded yet stay
  // zero-filled) and reaches the caller once all of the batch's lanes are done.
  using Updater = std::function<void(uint64_t key, float* stored, const float* incoming, size_t n)>;

  explicit ParamStore(Options opts);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Overrides the built-in rule for later pushes (an empty function restores it).
  void SetUpdater(Updater u);

  // Applies keys[i] with lens[i] floats taken back to back from `values` (lens: an array, or
  // RowLens::All for rows of one length). A key
  // first pushed is created zero-filled with the pushed length, then the rule
  // is applied (assign: copy; sum: +=; sgd: w -= lr * g). A length that differs
  // from the stored length is refused for that key (nothing applied to it) and
  // the other keys are still applied; the returned kInvalidArgument names the
  // first refused key. Null arrays with a non-zero count are kInvalidArgument.
  Status Push(const uint64_t* keys, RowLens lens, const float* values, size_t num_keys);

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
  std::unique_ptr<PushStream> BeginStream(const uint64_t* keys, RowLens lens, size_t num_keys,
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
  StreamHold HoldStreamsOff(const uint64_t* keys, RowLens lens, size_t num_keys);
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
  // embedding program): CopyValues then answers kAborted (naming the first such key in
  // batch order) and writes only the places of the keys whose length still matches; a key
  // removed in between is kNotFound.
  Status Lens(const uint64_t* keys, size_t num_keys, uint32_t* lens) const;
  Status CopyValues(const uint64_t* keys, size_t num_keys, const uint32_t* lens, float* out) const;
  // Pull in one step when every key holds `len` floats (an embedding table's rows): the
  // floats of key i go to out + i * len, which must hold num_keys * len. kNotFound names a
  // missing key; kFailedPrecondition names a key of another length, found on the way (the
  // walk ends soon after), and then `out` holds no meaning: the two steps above serve such
  // a batch (and name a missing key the walk did not reach).
  Status CopyUniform(const uint64_t* keys, size_t num_keys, uint32_t len, float* out) const;
  // Pull without a copy: out[i] is the stored memory of keys[i] (its length times 4 bytes),
  // pinned while the slice's owner is held. A push to a pinned key writes a fresh copy and
  // leaves the pinned memory alone, so a slice keeps the values of the moment it was taken
  // (a pull still sees every push applied before it). kNotFound names a missing key. A key
  // held in a run is moved to a block of its own first (and stays one).
  Status ShareValues(const uint64_t* keys, size_t num_keys, Slice* out) const;

  // For scaling and migration: every entry whose ServerForKey(key, num_servers)
  // differs from `rank`, sorted by key, erased from the store when `erase`.
  // A rank outside [0, num_servers) owns nothing, so a leaving server gets all
  // of its entries. Returns nothing for num_servers <= 0.
  std::vector<std::pair<uint64_t, std::vector<float>>> ExtractNotOwned(int rank, int num_servers,
                                                                       bool erase);

  // True when some entry's ServerForKey(key, num_servers) differs from `rank`.
  bool HasNotOwned(int rank, int num_servers) const;

  // As ShareValues for keys that are blocks of their own; the values of keys held in runs
  // are copied, all into one buffer the slices share (a snapshot of the whole store that
  // keeps its layout: the journal's compaction).
  Status ShareOrCopyValues(const uint64_t* keys, size_t num_keys, Slice* out) const;

  // Stores `value` under `key`, replacing any previous value.
  void Insert(uint64_t key, std::vector<float> value);
  // Insert of many keys at once: keys[i] gets lens[i] floats taken back to back from values.
  void Insert(const uint64_t* keys, RowLens lens, const float* values, size_t num_keys);
  // Removes the given keys (missing ones are fine); returns how many were present.
  size_t Erase(const uint64_t* keys, size_t num_keys);
  void Clear();

  // Snapshots: exact when no other thread is writing.
  std::vector<uint64_t> Keys() const;
  size_t num_keys() const;
  size_t num_floats() const;

  // Keys of at most this many floats are held in runs.
  static constexpr uint32_t kRunFloats = 1024;

 private:
  static constexpr int kStripeBits = 6;
  static constexpr size_t kStripes = size_t{1} << kStripeBits;
  // A run is closed at this many keys or floats (an insert into it moves at most that much).
  static constexpr size_t kRunMaxKeys = 1024;
  static constexpr size_t kRunMaxFloats = 16 * 1024;
  // An append of at least this many keys to a stripe's runs (a window of a sorted batch
  // creating keys) takes whole runs' room at once.
  static constexpr size_t kBulkAppendKeys = 64;

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
  // Sorted keys and their values back to back: keys[i] has `len` floats at values[i * len],
  // or, when offs is not empty (lengths differ), offs[i+1] - offs[i] floats at offs[i].
  struct Run {
    RunVector<uint64_t> keys;
    RunVector<uint64_t> offs;
    uint32_t len = 0;
    RunVector<float> values;
    uint64_t Off(size_t i) const { return offs.empty() ? uint64_t{i} * len : offs[i]; }
    uint32_t LenAt(size_t i) const { return offs.empty() ? len : static_cast<uint32_t>(offs[i + 1] - offs[i]); }
    float* At(size_t i) { return values.data() + Off(i); }
    const float* At(size_t i) const { return values.data() + Off(i); }
  };
  // Where the walk through a stripe's runs stands: run, index in it.
  struct Cursor {
    size_t run = 0;
    size_t pos = 0;
  };
  struct Stripe {
    mutable std::mutex mu;
    std::condition_variable released;  // a stream let go of a key of this stripe
    int waiters = 0;                   // pushes waiting for a stream to let go
    Entries entries;                   // keys held as blocks
    std::vector<Run> runs;             // keys held in runs, ordered by first key
    size_t run_keys = 0;
    size_t run_floats = 0;
  };
  // A batch is taken in windows of this many keys (its keys and values stay in cache while
  // the window's keys are applied stripe by stripe).
  static constexpr size_t kWindowKeys = 16 * 1024;
  // Keys [begin, end) of a batch grouped by stripe: order[starts[s] .. starts[s+1]) are the
  // indices of the keys of stripe s, in batch order.
  struct Groups {
    std::vector<uint32_t> order;
    std::array<size_t, kStripes + 1> starts{};
  };
  // Only the keys of stripes [first, last) are grouped (the others' groups are empty).
  static void GroupByStripe(const uint64_t* keys, size_t begin, size_t end, size_t first, size_t last, Groups* g);
  // A batch of num_keys keys (and `floats` floats of values, a push's) is split into at
  // most this many lanes (param_store.cc).
  size_t LanesFor(size_t num_keys, uint64_t floats = 0) const;
  // Runs lane(l, lanes) for each l < lanes, lanes at most `most`: lane 0 on the caller's
  // thread, the others on threads of their own (on the caller's when a thread cannot be
  // started), all done when it returns. Batches that run lanes at the same time (in any
  // store of the process) share the threads: with k of them, each takes most / k lanes
  // (at least one). A lane's exception is rethrown on the caller's thread once all are done.
  static void RunLanes(size_t most, const std::function<void(size_t lane, size_t lanes)>& lane);
  // Lane l's even share [*first, *end) of n things (stripes, or a batch's keys).
  static void ShareOf(size_t l, size_t lanes, size_t n, size_t* first, size_t* end) {
    *first = n * l / lanes;
    *end = n * (l + 1) / lanes;
  }
  // Where each key's values start among a batch's values, back to back: i * lens[0] when
  // all keys have one length, else offs[i].
  struct Offsets {
    Offsets(RowLens lens, size_t num_keys);
    uint64_t operator[](size_t i) const { return uniform ? uint64_t{i} * len0 : offs[i]; }
    bool uniform = true;
    uint32_t len0 = 0;
    uint64_t total = 0;  // <= 2^32 keys * 2^32 floats: cannot wrap
    std::vector<uint64_t> offs;  // only when not uniform
  };
  // Fresh memory for n values, zero-filled, or a copy of `from` (param_store.cc).
  static std::vector<float> FreshValues(size_t n, const std::vector<float>* from = nullptr);

  // ---- runs (param_store_runs.cc) ----
  // Finds `key` in the runs (stripe lock held), walking on from *c; *c is left at the key or
  // where it would go. Every push and pull takes it per key: the steps of a sorted batch
  // walking on are inline, below; SeekInRuns takes the rest (another run, a batch going
  // back, a key further on).
  static bool FindInRuns(const Stripe& stripe, uint64_t key, Cursor* c);
  static bool SeekInRuns(const Stripe& stripe, uint64_t key, Cursor* c);
  // Keys with their lengths, sorted by key.
  using KeyLens = std::vector<std::pair<uint64_t, uint32_t>>;
  // fill(f, values) fills fresh key f's values (zero-filled) where they were written.
  using FreshFill = std::function<void(size_t f, float* values)>;
  // Adds keys (sorted, distinct, in neither layout) to the runs, zero-filled, and filled by
  // *fill when given, each as it is written (stripe lock held).
  static void AddToRuns(Stripe& stripe, const KeyLens& fresh, const FreshFill* fill = nullptr);
  class RunWriter;
  // AddToRuns when every fresh key is after every stored one: the last run is filled up and
  // new runs follow it, in place.
  static void AppendToRuns(std::vector<Run>& runs, const KeyLens& fresh, const FreshFill* fill);
  // AddToRuns otherwise: the runs from the one the first fresh key falls in to the one the
  // last falls in are written anew, each that takes fresh keys merged, in place of the old.
  static void MergeIntoRuns(std::vector<Run>& runs, const KeyLens& fresh, const FreshFill* fill);
  // Removes the key at *c from its run (stripe lock held).
  static void RemoveFromRun(Stripe& stripe, const Cursor& c);
  // Moves the key at *c out of its run into a block of its own; returns the entry.
  static Entries::iterator MoveToBlock(Stripe& stripe, const Cursor& c);

  // ---- Push and Insert of a batch (param_store_apply.cc) ----
  enum class Mode { kPush, kInsert };
  struct Batch;
  // Folds one key's values into its stored ones (stripe lock held): an insert copies them,
  // a push applies the user rule when one is set, the built-in rule otherwise. Every apply
  // path of a batch goes through here.
  void Fold(Mode mode, const Updater* updater, uint64_t key, float* stored, const float* incoming,
            uint32_t len) const {
    if (mode == Mode::kInsert) {
      std::copy(incoming, incoming + len, stored);
    } else if (updater != nullptr) {
      (*updater)(key, stored, incoming, len);
    } else {
      ApplyRule(opts_.rule, opts_.learning_rate, stored, incoming, len);
    }
  }
  // Applies (or inserts) one key of a batch (stripe lock held). Returns false when the key
  // is in neither layout (then nothing was done) unless it is larger than a run holds and
  // `create`: then it is created as a block.
  bool ApplyKey(std::unique_lock<std::mutex>& lock, Stripe& stripe, Mode mode, const Updater* updater, uint64_t key,
                const float* incoming, uint32_t len, bool create, Cursor* c, Status* refused, bool* wants_spare);
  // ApplyKey for a key held as a block. False when no block holds it, or when an insert of
  // a small key took it out of its block (it goes back into a run).
  bool ApplyToBlock(std::unique_lock<std::mutex>& lock, Stripe& stripe, Mode mode, const Updater* updater,
                    uint64_t key, const float* incoming, uint32_t len, Cursor* c, Status* refused,
                    bool* wants_spare);
  Status Apply(Mode mode, const uint64_t* keys, RowLens lens, const float* values, size_t num_keys);
  // The batch's keys of stripes [first, end), window by window (one lane of Apply).
  void ApplyLane(Batch& b, size_t first, size_t end);
  // The keys [begin, end) of the batch (indices) that fall in one stripe, walked with *c.
  void ApplyToStripe(Batch& b, Stripe& stripe, Cursor* c, const uint32_t* begin, const uint32_t* end);
  // Key i of the batch, found in a run at c: when it has the pushed length, the common case,
  // folded in there (true). Every other case goes through ApplyKey.
  inline bool FoldAt(Batch& b, Stripe& stripe, const Cursor& c, uint32_t i);
  // ApplyKey with the batch's bookkeeping (refusals, spares) for key i of the batch.
  bool ApplyOne(Batch& b, std::unique_lock<std::mutex>& lock, Stripe& stripe, Cursor* c, uint32_t i, bool create);
  // Creates the batch's keys new to the stripe (b.missing) and applies their pushes.
  void CreateMissing(Batch& b, std::unique_lock<std::mutex>& lock, Stripe& stripe, Cursor* c, bool may_wait);

  // ---- reads (param_store_read.cc) ----
  // fn(lane, i, values, len, block or null) for each key under its stripe's lock; kNotFound
  // names the first missing key. With `share`, a key in a run is moved to a block first.
  // Once *stop (when given) is true the walk ends at the next stripe of its window. With
  // `lanes` (LanesFor), fn runs on as many threads at once, for distinct keys: whatever it
  // writes besides key i's own places must be the lane's own.
  template <typename Fn>
  Status ForEachStored(const uint64_t* keys, size_t num_keys, bool share, Fn fn, size_t lanes = 1,
                       const std::atomic<bool>* stop = nullptr) const;

  // ---- streams (param_store_stream.cc) ----
  // Waits (stripe lock held) until no stream holds `block`; revokes a stalled one.
  void WaitForWriter(std::unique_lock<std::mutex>& lock, Stripe& stripe, const BlockPtr& block);
  // The entry of `key` once no stream holds it (stripe lock held; the caller counts itself
  // in waiters); a key stored with another length than `len` is not waited for.
  Entries::iterator FindUnheld(std::unique_lock<std::mutex>& lock, Stripe& stripe, uint64_t key, uint32_t len);
  // The key's values to write (stripe lock held): a fresh copy if slices are out.
  static std::vector<float>& Writable(BlockPtr& block);
  Stripe& StripeFor(uint64_t key);
  const Stripe& StripeFor(uint64_t key) const;
  // A zero-filled spare block for `key`, made outside the locks (within the budget).
  void PrepareSpare(uint64_t key, uint32_t len);
  // Keeps `target` (a block of stored's length that no entry holds: a stream's unused
  // target, or the block its commit replaced) as stored's spare, when stored has none and
  // the budget allows (stripe lock held).
  void KeepAsSpare(Block& stored, BlockPtr& target);

  const Options opts_;
  std::atomic<uint64_t> spare_bytes_{0};
  std::atomic<uint64_t> held_keys_{0};  // blocks with a writer
  std::shared_ptr<const Updater> updater_;  // Accessed with std::atomic_load/store.
  mutable std::array<Stripe, kStripes> stripes_;  // mutable: ShareValues moves keys out of runs
};

inline bool ParamStore::FindInRuns(const Stripe& stripe, uint64_t key, Cursor* c) {
  // A sorted batch walking on through the cursor's run: the key at most 4 places past the
  // cursor, found by counting the keys before it among the next three (the three loads go
  // at once, and no branch guesses the step: for a batch of every other stored key it is
  // a coin toss). A key between two of the run's keys is in no run.
  if (c->run < stripe.runs.size()) {
    const RunVector<uint64_t>& ks = stripe.runs[c->run].keys;
    const size_t p = c->pos;
    if (p + 4 < ks.size() && ks[p] < key) {
      const size_t i = p + 1 + static_cast<size_t>(ks[p + 1] < key) + static_cast<size_t>(ks[p + 2] < key) +
                       static_cast<size_t>(ks[p + 3] < key);  // sorted: how many are before the key
      if (ks[i] >= key) {
        c->pos = i;
        return ks[i] == key;
      }
    }
  }
  return SeekInRuns(stripe, key, c);
}

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
