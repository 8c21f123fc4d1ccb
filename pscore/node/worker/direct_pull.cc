#include "pscore/node/worker/direct_pull.h"

#include <algorithm>

#include "pscore/comm/address.h"
#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/direct_control.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

DirectPuller::DirectPuller(const NodeOptions& options, std::shared_ptr<std::atomic<uint64_t>> copied,
                           std::function<int()> rank)
    : options_(options), copied_(std::move(copied)), rank_(std::move(rank)) {}

size_t DirectPuller::ranges() {
  std::lock_guard<std::mutex> lock(mu_);
  return route_.addrs.size();
}

std::optional<Result<PullResult>> DirectPuller::TryPull(const std::vector<uint64_t>& keys) {
  constexpr size_t kMaxDirectKeys = 2048;  // a request of at most 16 KiB of keys
  if (keys.empty() || keys.size() > kMaxDirectKeys) return std::nullopt;
  // The direct links are plaintext blocking sockets: with TLS every pull goes over the
  // loop's (encrypted) links.
  if (options_.tls != nullptr) return std::nullopt;
  std::string addr;
  std::unique_ptr<comm::BlockingLink> link;
  if (!Owner(keys, &addr, &link)) return std::nullopt;
  if (!link) link = Dial(addr);
  if (!link || !TakeOut(addr, link.get())) return std::nullopt;
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, rank_());
  meta.set_handler(kPullHandler);
  const uint64_t copied_before = link->payload_bytes_copied();
  Result<comm::Frame> answer =
      link->Call(meta, core::EncodePullRequest(keys.data(), keys.size()), options_.request_timeout);
  Bring(addr, link.get());
  copied_->fetch_add(link->payload_bytes_copied() - copied_before, std::memory_order_relaxed);
  if (!answer.ok()) {
    const Code code = answer.status().code();
    // The link failed (the loop's path knows how to wait for a server or a scale), or
    // the keys moved in a scale (kAborted; nothing was read): the ordinary Pull decides.
    if (link->broken() && code != Code::kTimeout) return std::nullopt;
    if (code == Code::kAborted) return std::nullopt;
    if (!link->broken()) KeepIdle(addr, std::move(link));
    return Result<PullResult>(answer.status());
  }
  KeepIdle(addr, std::move(link));
  return Decode(*answer, keys.size());
}

bool DirectPuller::Owner(const std::vector<uint64_t>& keys, std::string* addr,
                         std::unique_ptr<comm::BlockingLink>* link) {
  std::lock_guard<std::mutex> lock(mu_);
  const int n = static_cast<int>(route_.addrs.size());
  if (!route_.usable || n == 0) return false;
  const int owner = core::ServerForKey(keys[0], n);
  for (uint64_t k : keys) {
    if (core::ServerForKey(k, n) != owner) return false;
  }
  *addr = route_.addrs[owner];
  auto idle = idle_.find(*addr);
  if (idle != idle_.end() && !idle->second.empty()) {
    *link = std::move(idle->second.back());
    idle->second.pop_back();
  }
  return true;
}

std::unique_ptr<comm::BlockingLink> DirectPuller::Dial(const std::string& addr) {
  Result<comm::HostPort> where = comm::ParseHostPort(addr);
  if (!where.ok()) {
    VLOG(1) << options_.node_id << ": direct link to " << addr << ": " << where.status();
    return nullptr;
  }
  std::unique_ptr<comm::BlockingLink> link = DialDirect(options_, where->host, where->port, "a server");
  if (!link) return nullptr;
  // Say who we are first, as on the loop's links: servers serve members only.
  pb::HelloMessage hello;
  hello.set_node_id(options_.node_id);
  hello.set_role(pb::WORKER);
  const int rank = rank_();
  hello.set_rank_id(rank);
  if (!link->Notify(MakeMeta(pb::HELLO, pb::WORKER, rank), ToBuffer(hello), DirectConnectTimeout(options_)).ok()) {
    return nullptr;
  }
  return link;
}

// Out with this thread from here: the loop interrupts it once the server is timed out or
// no longer the keys' primary. Checked again under the lock, so a route that changed
// while the link was taken or dialled is not missed.
bool DirectPuller::TakeOut(const std::string& addr, comm::BlockingLink* link) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!route_.usable || std::find(route_.addrs.begin(), route_.addrs.end(), addr) == route_.addrs.end()) {
    return false;
  }
  busy_.emplace(addr, link);
  return true;
}

void DirectPuller::Bring(const std::string& addr, comm::BlockingLink* link) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [begin, end] = busy_.equal_range(addr);
  for (auto it = begin; it != end; ++it) {
    if (it->second == link) {
      busy_.erase(it);
      return;
    }
  }
}

void DirectPuller::KeepIdle(const std::string& addr, std::unique_ptr<comm::BlockingLink> link) {
  std::lock_guard<std::mutex> lock(mu_);
  if (route_.stopped) return;  // dropped: the link closes as the caller lets go of it
  idle_[addr].push_back(std::move(link));
}

Result<PullResult> DirectPuller::Decode(const comm::Frame& answer, size_t keys) {
  const BufferPtr& b = answer.payload;
  Result<core::KvView> view =
      core::DecodeKvPairs(b ? b->data() : "", b ? b->size() : 0, /*expect_values=*/true, /*answer=*/true);
  if (!view.ok()) return view.status();
  if (view->num_keys != keys) {
    return Status(Code::kProtocol,
                  "pull: answer has " + std::to_string(view->num_keys) + " keys, asked " + std::to_string(keys));
  }
  PullResult out;
  if (view->lens != nullptr) {
    out.lens.assign(view->lens, view->lens + view->num_keys);
  } else {
    out.lens.assign(view->num_keys, view->row_len);
  }
  out.values.assign(view->values, view->values + view->num_values);
  copied_->fetch_add(view->num_values * sizeof(float), std::memory_order_relaxed);
  pulls_.fetch_add(1, std::memory_order_relaxed);
  return out;
}

void DirectPuller::SetRoute(bool usable, std::vector<std::string> addrs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (route_.stopped) return;
  std::vector<std::string> gone;
  for (const auto& [addr, links] : idle_) gone.push_back(addr);
  for (const auto& [addr, link] : busy_) gone.push_back(addr);
  for (const std::string& addr : gone) {
    if (std::find(addrs.begin(), addrs.end(), addr) == addrs.end()) InterruptLocked(addr, "serves no key range now");
  }
  route_.usable = usable;
  route_.addrs = std::move(addrs);
}

void DirectPuller::ServerTimedOut(const std::string& addr) {
  std::lock_guard<std::mutex> lock(mu_);
  route_.usable = false;
  InterruptLocked(addr, "timed out at the scheduler");
}

void DirectPuller::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  route_ = Route();
  route_.stopped = true;
  idle_.clear();  // a link out with a caller is dropped when it comes back
  for (const auto& [addr, link] : busy_) link->Interrupt();  // its caller ends now
}

void DirectPuller::InterruptLocked(const std::string& addr, const char* why) {
  idle_.erase(addr);
  auto [begin, end] = busy_.equal_range(addr);
  for (auto it = begin; it != end; ++it) {
    VLOG(1) << options_.node_id << ": direct pull to " << addr << " interrupted: " << why;
    it->second->Interrupt();
  }
}

}  // namespace pscore::node
