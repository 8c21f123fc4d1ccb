// ParamStore: construction, the stripes, blocks, and the whole-store operations (migration
// scans, erase, snapshots). Push and Insert are in param_store_apply.cc, the runs in
// param_store_runs.cc, reads in param_store_read.cc, streamed pushes in
// param_store_stream.cc.
#include "pscore/core/param_store.h"

#include <algorithm>
#include <exception>
#include <system_error>
#include <thread>
#include <utility>

#include "pscore/core/key_range.h"

namespace pscore {
namespace core {

namespace {

// hardware_concurrency reads /sys on every call: the machine's cores are asked once, here.
ParamStore::Options WithBatchThreads(ParamStore::Options opts) {
  if (opts.batch_threads == 0) {
    opts.batch_threads = std::min(std::max(1u, std::thread::hardware_concurrency()), ParamStore::kMostBatchThreads);
  }
  return opts;
}

}  // namespace

ParamStore::ParamStore(Options opts) : opts_(WithBatchThreads(opts)) {}

size_t ParamStore::LanesFor(size_t num_keys, uint64_t floats) const {
  const uint64_t work = std::max<uint64_t>(num_keys / kLaneKeys, floats / kLaneFloats);
  return std::max<size_t>(1, std::min<uint64_t>(opts_.batch_threads, work));
}

void ParamStore::RunLanes(size_t most, const std::function<void(size_t, size_t)>& lane) {
  if (most <= 1) return lane(0, 1);
  static std::atomic<size_t> running{0};  // batches running lanes now, in this process
  const size_t lanes = std::max<size_t>(1, most / (running.fetch_add(1, std::memory_order_relaxed) + 1));
  struct Leave {
    ~Leave() { running.fetch_sub(1, std::memory_order_relaxed); }
  } leave;
  // An exception of a lane (a user's update rule may throw) is rethrown here once every
  // lane is done, as the one-lane batch's reaches its caller; the first lane's wins.
  std::vector<std::exception_ptr> thrown(lanes);
  auto run = [&lane, &thrown, lanes](size_t l) {
    try {
      lane(l, lanes);
    } catch (...) {
      thrown[l] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  std::vector<size_t> here{0};  // lanes run on this thread
  for (size_t l = 1; l < lanes; ++l) {
    try {
      threads.emplace_back(run, l);
    } catch (const std::system_error&) {
      here.push_back(l);
    }
  }
  for (size_t l : here) run(l);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : thrown) {
    if (e) std::rethrow_exception(e);
  }
}

void ParamStore::SetUpdater(Updater u) {
  std::shared_ptr<const Updater> next;
  if (u) next = std::make_shared<const Updater>(std::move(u));
  std::atomic_store(&updater_, std::move(next));
}

// The top bits of the mixed key pick the stripe, so dense keys spread evenly.
ParamStore::Stripe& ParamStore::StripeFor(uint64_t key) {
  return stripes_[KeyPosition(key) >> (64 - kStripeBits)];
}

const ParamStore::Stripe& ParamStore::StripeFor(uint64_t key) const {
  return stripes_[KeyPosition(key) >> (64 - kStripeBits)];
}

// Advised into huge pages before its first write (AdviseHugePages, pscore/core/buffer.h), so a
// large key's block is faulted in about 3x faster.
std::vector<float> ParamStore::FreshValues(size_t n, const std::vector<float>* from) {
  std::vector<float> v;
  v.reserve(n);
  AdviseHugePages(v.data(), n * sizeof(float));
  if (from != nullptr) {
    v.insert(v.end(), from->begin(), from->end());
  } else {
    v.resize(n);
  }
  return v;
}

std::vector<float>& ParamStore::Writable(BlockPtr& block) {
  // Acquire: pairs with the release of the last slice let go, so its reads (a socket
  // write on another thread) happen before this thread writes the memory.
  if (block->readers.load(std::memory_order_acquire) != 0) {
    block = std::make_shared<Block>(FreshValues(block->values.size(), &block->values));
  }
  return block->values;
}

ParamStore::Offsets::Offsets(RowLens lens, size_t num_keys) {
  if (num_keys == 0) return;
  len0 = lens[0];
  if (lens.uniform()) {
    total = uint64_t{len0} * num_keys;
    return;
  }
  for (size_t i = 0; i < num_keys; ++i) {
    total += lens[i];
    uniform = uniform && lens[i] == len0;
  }
  if (uniform) return;
  offs.resize(num_keys);
  uint64_t off = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    offs[i] = off;
    off += lens[i];
  }
}

std::vector<std::pair<uint64_t, std::vector<float>>> ParamStore::ExtractNotOwned(
    int rank, int num_servers, bool erase) {
  std::vector<std::pair<uint64_t, std::vector<float>>> out;
  if (num_servers <= 0) return out;
  for (Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (auto it = stripe.entries.begin(); it != stripe.entries.end();) {
      if (ServerForKey(it->first, num_servers) == rank) {
        ++it;
      } else if (erase) {
        Block& b = *it->second;
        // Pinned values are read by a socket write: copied, not moved away under it.
        if (b.readers.load(std::memory_order_acquire) == 0) {
          out.emplace_back(it->first, std::move(b.values));
        } else {
          out.emplace_back(it->first, b.values);
        }
        it = stripe.entries.erase(it);
      } else {
        out.emplace_back(it->first, it->second->values);
        ++it;
      }
    }
    std::vector<Run> kept;
    for (Run& run : stripe.runs) {
      Run left;
      left.len = run.len;
      if (!run.offs.empty()) left.offs.assign(1, 0);
      bool moved = false;
      for (size_t i = 0; i < run.keys.size(); ++i) {
        const uint32_t len = run.LenAt(i);
        if (ServerForKey(run.keys[i], num_servers) != rank) {
          out.emplace_back(run.keys[i], std::vector<float>(run.At(i), run.At(i) + len));
          moved = true;
          if (erase) {
            --stripe.run_keys;
            stripe.run_floats -= len;
            continue;
          }
        }
        if (!erase) continue;
        left.keys.push_back(run.keys[i]);
        left.values.insert(left.values.end(), run.At(i), run.At(i) + len);
        if (!left.offs.empty()) left.offs.push_back(left.values.size());
      }
      if (!erase || !moved) {
        kept.push_back(std::move(run));
      } else if (!left.keys.empty()) {
        kept.push_back(std::move(left));
      }
    }
    stripe.runs = std::move(kept);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool ParamStore::HasNotOwned(int rank, int num_servers) const {
  if (num_servers <= 0) return false;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) {
      if (ServerForKey(entry.first, num_servers) != rank) return true;
    }
    for (const Run& run : stripe.runs) {
      for (uint64_t key : run.keys) {
        if (ServerForKey(key, num_servers) != rank) return true;
      }
    }
  }
  return false;
}

size_t ParamStore::Erase(const uint64_t* keys, size_t num_keys) {
  size_t erased = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    Cursor c;
    if (FindInRuns(stripe, keys[i], &c)) {
      RemoveFromRun(stripe, c);
      ++erased;
    } else {
      erased += stripe.entries.erase(keys[i]);
    }
  }
  return erased;
}

void ParamStore::Clear() {
  for (Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    stripe.entries.clear();
    stripe.runs.clear();
    stripe.run_keys = 0;
    stripe.run_floats = 0;
  }
}

std::vector<uint64_t> ParamStore::Keys() const {
  std::vector<uint64_t> out;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) out.push_back(entry.first);
    for (const Run& run : stripe.runs) out.insert(out.end(), run.keys.begin(), run.keys.end());
  }
  return out;
}

size_t ParamStore::num_keys() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    n += stripe.entries.size() + stripe.run_keys;
  }
  return n;
}

size_t ParamStore::num_floats() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    n += stripe.run_floats;
    for (const auto& entry : stripe.entries) n += entry.second->values.size();
  }
  return n;
}

}  // namespace core
}  // namespace pscore
