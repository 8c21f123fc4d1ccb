#include "pscore/node/worker/pull_request.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

namespace pscore::node {

namespace {

// Room for `floats` floats in v, not yet written. A large result is fresh memory on
// every call (glibc maps it anew past 32 MiB), so it is asked for in huge pages before
// its first write (pscore/core/buffer.h).
void ReserveResult(std::vector<float>& v, size_t floats) {
  v.reserve(floats);
  AdviseHugePages(v.data(), floats * sizeof(float));
}

// Room for n elements in v; fresh memory is asked for in huge pages before its first
// write when large: a pull of millions of keys holds several arrays of a few bytes per key.
template <typename T>
void ReserveAdvised(std::vector<T>& v, size_t n) {
  if (v.capacity() >= n) return;  // kept from an earlier request: already mapped
  v.reserve(n);
  AdviseHugePages(v.data(), n * sizeof(T));
}

size_t Total(const std::vector<uint32_t>& lens) { return std::accumulate(lens.begin(), lens.end(), size_t{0}); }

}  // namespace

PullRequest::~PullRequest() {
  if (!scratch) return;
  scratch->Give(std::move(keys));
  scratch->Give(std::move(src));
}

void PullRequest::Begin(const std::vector<uint64_t>& k, std::shared_ptr<ScratchArrays> arrays) {
  scratch = std::move(arrays);
  keys = scratch->TakeWords(k.size());
  ReserveAdvised(keys, k.size());
  keys.assign(k.begin(), k.end());
  src = scratch->TakePointers(k.size());
  src.clear();  // sized by NeedSrc, if an answer writes it
  ReserveAdvised(src, k.size());
  src_lens.clear();
  ReserveAdvised(src_lens, k.size());  // the result's: not kept
  outstanding = keys.size();
}

bool PullRequest::SinkRegion(const KeyIndices& indices, uint64_t* off, uint64_t* floats) const {
  if (dest == nullptr || no_sinks || dest_floats == 0 || indices.empty()) return false;
  if (indices.size() == keys.size()) {
    *off = 0;
    *floats = dest_floats;
    return true;
  }
  const size_t a = indices.front();
  const size_t b = indices.back() + 1;
  if (expect_off.empty() || b - a != indices.size()) return false;  // no layout, or not consecutive
  *off = expect_off[a];
  *floats = (b < keys.size() ? expect_off[b] : dest_floats) - *off;
  return *floats > 0;
}

bool PullRequest::Misplaced() const {
  if (in_dest.empty()) return false;
  uint64_t at = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    if (in_dest[i] && static_cast<uint64_t>(src[i] - dest) != at) return true;
    at += src_lens[i];
  }
  return false;
}

void PullRequest::ForgetLearned() {
  if (learner != nullptr) learner->Forget(keys, expect_off, dest_floats, src_lens);
}

void PullRequest::CopyRestIntoDest() {
  float* out = dest;
  for (size_t i = 0; i < src.size(); ++i) {
    if (in_dest.empty() || !in_dest[i]) {
      std::memcpy(out, src[i], src_lens[i] * sizeof(float));
      CountCopied(src_lens[i] * sizeof(float));
    }
    out += src_lens[i];
  }
}

void PullRequest::SpreadStretches() {
  if (stretches.empty()) return;
  NeedSrc();
  for (const Stretch& s : stretches) {
    const float* p = s.values;
    for (size_t j = 0; j < s.count; ++j) {
      const uint32_t len = s.lens != nullptr ? s.lens[j] : s.row_len;
      src[s.first + j] = p;
      src_lens[s.first + j] = len;
      p += len;
    }
  }
  stretches.clear();
}

// Reserve + insert: the values are written once (resize would zero them first). The
// counts move into the result: the request is done with them.
PullResult PullRequest::CopyResult() {
  PullResult out;
  size_t covered = 0;
  for (const Stretch& s : stretches) covered += s.count;
  if (covered == keys.size() && covered > 0) {
    // Every answer kept whole, and together they cover the keys once each: each stretch's
    // lens and values appended in key order (written once, not zero-filled first), no
    // walk per key through src.
    std::sort(stretches.begin(), stretches.end(), [](const Stretch& a, const Stretch& b) { return a.first < b.first; });
    uint64_t total = 0;
    src_lens.clear();
    for (const Stretch& s : stretches) {
      if (s.lens != nullptr) {
        src_lens.insert(src_lens.end(), s.lens, s.lens + s.count);
      } else {
        src_lens.insert(src_lens.end(), s.count, s.row_len);
      }
      total += s.floats;
    }
    ReserveResult(out.values, total);
    for (const Stretch& s : stretches) {
      if (s.floats > 0) out.values.insert(out.values.end(), s.values, s.values + s.floats);
    }
    CountCopied(out.values.size() * sizeof(float));
    out.lens = std::move(src_lens);
    stretches.clear();
    answers.clear();
    return out;
  }
  SpreadStretches();
  const size_t total = Total(src_lens);
  ReserveResult(out.values, total);
  // Keys whose values lie back to back in one answer are copied as one run. Where the
  // keys' servers interleave, a run averages a key or two: short runs are gathered in a
  // small buffer and appended a buffer at a time (an insert per run costs more than the
  // copy), long ones appended directly.
  constexpr size_t kStaged = 1024;
  float staged[kStaged];
  size_t held = 0;
  for (size_t i = 0; i < src.size();) {
    const float* from = src[i];
    const float* to = src[i] + src_lens[i];
    for (++i; i < src.size() && src[i] == to; ++i) to += src_lens[i];
    const size_t run = static_cast<size_t>(to - from);
    if (run > kStaged - held) {
      out.values.insert(out.values.end(), staged, staged + held);
      held = 0;
      if (run >= kStaged) {
        out.values.insert(out.values.end(), from, to);
        continue;
      }
    }
    if (run == 1) {
      staged[held++] = *from;
    } else if (run > 0) {  // an empty key's src may be null
      std::memcpy(staged + held, from, run * sizeof(float));
      held += run;
    }
  }
  out.values.insert(out.values.end(), staged, staged + held);
  CountCopied(out.values.size() * sizeof(float));
  out.lens = std::move(src_lens);
  answers.clear();
  return out;
}

// A pull of keys whose sizes earlier answers told: the result is allocated here
// (zero-filled: std::vector), on the calling thread, and each answer is read from the
// socket straight into its place in it (no copy on the worker, none on its loop thread).
void PullCopyRequest::AllocateResult(uint64_t total, std::vector<uint64_t> offsets, LearnedLens* lens) {
  ReserveResult(result_, total);
  result_.resize(total);
  into_result_ = true;
  learner = lens;
  dest = result_.data();
  dest_floats = total;
  expect_off = std::move(offsets);
}

// Into its own result: the answers read into it are in place; those that were not (keys
// of a server not consecutive, a small answer) are copied to their place. Should the sizes
// have changed since they were learned, the result is copied anew instead.
void PullCopyRequest::Complete() {
  if (!into_result_) return done_.set_value(CopyResult());
  if (Total(src_lens) != dest_floats || Misplaced()) {
    ForgetLearned();
    return done_.set_value(CopyResult());
  }
  CopyRestIntoDest();
  answers.clear();
  PullResult r;
  r.lens = std::move(src_lens);
  r.values = std::move(result_);
  done_.set_value(std::move(r));
}

void PullViewRequest::Complete() {
  PullView out;
  out.lens = std::move(src_lens);
  out.values = std::move(src);
  out.owners = std::move(answers);
  done_.set_value(std::move(out));
}

Status PullIntoRequest::SetDest(float* out, size_t floats, std::vector<uint32_t>* lens, LearnedLens* learned) {
  if (out == nullptr && floats > 0) {
    return Status(Code::kInvalidArgument, "pull: null destination for " + std::to_string(floats) + " floats");
  }
  static float none;  // a non-null destination for zero floats
  dest = out != nullptr ? out : &none;
  dest_floats = floats;
  dest_lens_ = lens;
  if (lens != nullptr && !keys.empty() && lens->size() == keys.size()) {
    // The caller's lens (e.g. from the last call with these keys) as the expected layout.
    expect_off.resize(keys.size());
    uint64_t off = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      expect_off[i] = off;
      off += (*lens)[i];
    }
    if (off != floats) expect_off.clear();  // cannot be right: not used
  }
  uint64_t learned_total = 0;
  std::vector<uint64_t> offsets;
  if (expect_off.empty() && keys.size() > 1 && learned->Layout(keys, &offsets, &learned_total) &&
      learned_total == floats) {
    expect_off = std::move(offsets);  // no layout given: the sizes earlier answers told
    learner = learned;
  }
  return Status::Ok();
}

void PullIntoRequest::Complete() {
  const size_t total = Total(src_lens);
  if (total != dest_floats) {
    ForgetLearned();
    answers.clear();
    done_.set_value(Status(Code::kInvalidArgument, "pull: the keys hold " + std::to_string(total) +
                                                       " floats, the destination " + std::to_string(dest_floats)));
    return;
  }
  CopyRestIntoDest();
  if (dest_lens_ != nullptr) *dest_lens_ = std::move(src_lens);  // the request is done with them
  answers.clear();
  done_.set_value(Status::Ok());
}

}  // namespace pscore::node
