// The pull requests of a WorkerNode: PullRequest holds what every pull shares (its keys and
// where each key's floats arrived, or the caller's memory answers may be read into); one
// type per call gives the result its caller asked for: Pull (PullCopyRequest), ZPull
// (PullViewRequest), PullInto (PullIntoRequest). Loop thread only after creation.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "pscore/node/worker/kv_request.h"
#include "pscore/node/worker/learned_lens.h"
#include "pscore/node/worker/pull_result.h"
#include "pscore/node/worker/scratch_arrays.h"

namespace pscore::node {

class PullRequest : public KvRequest {
 public:
  std::vector<uint64_t> keys;
  // The answers stay alive until the result is assembled (with one copy at most).
  std::vector<BufferPtr> answers;
  // Per requested key: its floats inside an answer (or dest), and their count. Both are
  // sized by the first answer that writes them (NeedSrc); a result made of stretches only
  // has its counts written once, in CopyResult.
  std::vector<const float*> src;
  std::vector<uint32_t> src_lens;
  // Answers to runs of consecutive keys, kept whole where the values are copied out only at
  // the end (takes_stretches): their keys' src and src_lens are not written one by one.
  struct Stretch {
    size_t first = 0;                // the first key's index
    size_t count = 0;                // keys
    const float* values = nullptr;   // their floats back to back, inside an answer
    uint64_t floats = 0;
    const uint32_t* lens = nullptr;  // per key, or null: every key holds row_len floats
    uint32_t row_len = 0;
  };
  std::vector<Stretch> stretches;

  // Memory answers may be read into from the socket (an AnswerSink per request) where their
  // place is known: all the keys (the whole of dest), or a run of consecutive keys when
  // the layout is given: expect_off[i] is key i's expected offset in dest (empty: no
  // layout). in_dest[i]: key i's floats were read into dest at src[i]. no_sinks: pulled
  // again after a wrong layout, answers are copied.
  float* dest = nullptr;
  size_t dest_floats = 0;
  std::vector<uint64_t> expect_off;
  std::vector<char> in_dest;
  bool no_sinks = false;
  // Set when expect_off came from the learned sizes: forgets those found wrong.
  LearnedLens* learner = nullptr;
  std::shared_ptr<ScratchArrays> scratch;

  ~PullRequest() override;
  // The keys are set and every key awaits its answer. Large arrays are taken from
  // `scratch` and given back when the request is done.
  void Begin(const std::vector<uint64_t>& k, std::shared_ptr<ScratchArrays> scratch);
  // The span of dest (float offset and count) an answer to the keys `indices` (increasing)
  // may be read into, or false.
  bool SinkRegion(const KeyIndices& indices, uint64_t* off, uint64_t* floats) const;
  // True when some values were read into dest where the answers' lens do not put them
  // (the layout was wrong before them while the totals still matched).
  bool Misplaced() const;
  // True when dest is the caller's (PullInto): a misplaced answer means pulling again.
  virtual bool caller_dest() const { return false; }
  // True when answers to consecutive keys may be kept as stretches (nothing reads src
  // before the result is copied).
  virtual bool takes_stretches() const { return false; }
  // src and src_lens sized for every key (before an answer writes its keys' places).
  void NeedSrc() {
    if (src.size() != keys.size()) src.resize(keys.size());
    if (src_lens.size() != keys.size()) src_lens.resize(keys.size());
  }
  // Forgets the learned sizes that laid out dest wrongly (when they did).
  void ForgetLearned();

 protected:
  explicit PullRequest(KvCounters counters) : KvRequest(Kind::kPull, std::move(counters)) {}
  void Abandon() override {
    stretches.clear();
    answers.clear();
  }
  // Copies the values not read into dest to their place there (those that were are
  // already in place: checked by Misplaced; the total matches dest_floats).
  void CopyRestIntoDest();
  // Pull's result, every value copied once out of where it arrived.
  PullResult CopyResult();
  // The stretches' keys' src and src_lens written, as the other answers' are.
  void SpreadStretches();
};

// Pull: the values copied into a result of their own; when the keys' sizes were learned,
// the result is allocated up front and answers are read into it in place (dest).
class PullCopyRequest final : public PullRequest {
 public:
  explicit PullCopyRequest(KvCounters counters) : PullRequest(std::move(counters)) {}
  std::future<Result<PullResult>> future() { return done_.get_future(); }
  // Calling thread, before sending: the result laid out by `offsets` (total floats).
  void AllocateResult(uint64_t total, std::vector<uint64_t> offsets, LearnedLens* lens);
  bool takes_stretches() const override { return !into_result_; }

 private:
  void Complete() override;
  void Settle(const Status& st) override { done_.set_value(st); }
  std::vector<float> result_;
  bool into_result_ = false;
  std::promise<Result<PullResult>> done_;
};

// ZPull: a view of the answers as they arrived.
class PullViewRequest final : public PullRequest {
 public:
  explicit PullViewRequest(KvCounters counters) : PullRequest(std::move(counters)) {}
  std::future<Result<PullView>> future() { return done_.get_future(); }

 private:
  void Complete() override;
  void Settle(const Status& st) override { done_.set_value(st); }
  std::promise<Result<PullView>> done_;
};

// PullInto: the values written to the caller's dest (and their counts to *dest_lens).
class PullIntoRequest final : public PullRequest {
 public:
  explicit PullIntoRequest(KvCounters counters) : PullRequest(std::move(counters)) {}
  std::future<Status> future() { return done_.get_future(); }
  // Calling thread: dest is the caller's `floats` floats; `lens`, when it holds a count per
  // key, is the expected layout, else the sizes in `learned` (the worker's; all keys known) are.
  Status SetDest(float* out, size_t floats, std::vector<uint32_t>* lens, LearnedLens* learned);
  bool caller_dest() const override { return true; }

 private:
  void Complete() override;
  void Settle(const Status& st) override { done_.set_value(st); }
  bool DeferFailure() const override { return parts_sent > 0; }
  std::vector<uint32_t>* dest_lens_ = nullptr;
  std::promise<Status> done_;
};

}  // namespace pscore::node
