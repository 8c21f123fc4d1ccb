#include "pscore/node/common/direct_control.h"

#include <algorithm>

#include "pscore/comm/address.h"

namespace pscore::node {

Duration DirectConnectTimeout(const NodeOptions& options) {
  return std::min<Duration>(options.connect_timeout, std::chrono::seconds(2));
}

std::unique_ptr<comm::BlockingLink> DialDirect(const NodeOptions& options, const std::string& host, int port,
                                               const std::string& what) {
  comm::BlockingLinkOptions lo;
  lo.limits.max_message_bytes = options.max_message_bytes;
  lo.auth_token = options.cluster_token;
  lo.connect_timeout = DirectConnectTimeout(options);
  Result<std::unique_ptr<comm::BlockingLink>> dialed = comm::BlockingLink::Dial(host, port, lo);
  if (!dialed.ok()) {
    VLOG(1) << options.node_id << ": direct link to " << what << " at " << comm::JoinHostPort(host, port) << ": "
            << dialed.status();
    return nullptr;
  }
  return std::move(*dialed);
}

std::optional<Result<comm::Frame>> DirectControl::TryCall(pb::NodeCommand cmd, const BufferPtr& payload,
                                                            Duration timeout, uint64_t* session) {
  if (options_.tls != nullptr || !options_.direct_control_calls) return std::nullopt;
  pb::MessageMeta meta;
  uint64_t generation = 0;
  std::unique_ptr<comm::BlockingLink> link = TakeOut(&meta, &generation);
  if (!link) return std::nullopt;
  meta.set_cmd(cmd);
  if (session != nullptr) *session = meta.session_id();
  Result<comm::Frame> answer = link->Call(std::move(meta), payload, timeout);
  const bool broken = link->broken();
  Bring(std::move(link), generation);
  // A failed link (the scheduler went away, the way was closed, the deadline passed with no
  // answer): the loop's way knows how to wait for the scheduler and re-issue.
  if (broken) return std::nullopt;
  calls_.fetch_add(1, std::memory_order_relaxed);
  return answer;
}

std::unique_ptr<comm::BlockingLink> DirectControl::TakeOut(pb::MessageMeta* meta, uint64_t* generation) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!way_.open) return nullptr;
    *meta = way_.meta;
    *generation = way_.generation;
    if (!idle_.empty()) {
      std::unique_ptr<comm::BlockingLink> link = std::move(idle_.back());
      idle_.pop_back();
      busy_.insert(link.get());
      return link;
    }
    if (busy_.size() + dialing_ >= kMaxLinks || SteadyClock().Now() < way_.no_dial_until) return nullptr;
    ++dialing_;
  }
  std::unique_ptr<comm::BlockingLink> link =  // blocking: not under mu_
      DialDirect(options_, options_.scheduler_host, options_.scheduler_port, "the scheduler");
  std::lock_guard<std::mutex> lock(mu_);
  --dialing_;
  if (!link) way_.no_dial_until = SteadyClock().Now() + kDialBackoff;
  // Closed (or closed and opened again) while dialing: the link may lead to the old scheduler.
  if (!link || !way_.open || way_.generation != *generation) return nullptr;
  busy_.insert(link.get());
  return link;
}

void DirectControl::Bring(std::unique_ptr<comm::BlockingLink> link, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_.erase(link.get());
  // Otherwise the link closes here, under mu_, so a Close cannot interrupt it meanwhile.
  if (!link->broken() && way_.open && way_.generation == generation) idle_.push_back(std::move(link));
}

void DirectControl::Open(pb::MessageMeta meta) {
  std::lock_guard<std::mutex> lock(mu_);
  if (way_.stopped) return;
  way_.open = true;
  way_.meta = std::move(meta);
}

void DirectControl::Close(const char* why) {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked(why);
}

void DirectControl::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked("the node stopped");
  way_.stopped = true;
}

void DirectControl::CloseLocked(const char* why) {
  if (!way_.open && idle_.empty() && busy_.empty()) return;
  way_.open = false;
  ++way_.generation;
  idle_.clear();
  for (comm::BlockingLink* link : busy_) {
    VLOG(1) << options_.node_id << ": direct call to the scheduler interrupted: " << why;
    link->Interrupt();
  }
}

}  // namespace pscore::node
