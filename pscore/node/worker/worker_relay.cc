// WorkerNode's routes around a partial partition (docs/reliability.md, Partial partitions):
// a server this worker cannot reach while the scheduler still hears it is reached through
// another server, which forwards each part unchanged (MessageMeta.relay_rank).
#include <string>
#include <vector>

#include "pscore/node/common/wire.h"
#include "pscore/node/worker/worker_node.h"

namespace pscore::node {

namespace {

bool IsLive(const std::vector<char>& live, int rank) {
  return rank >= 0 && static_cast<size_t>(rank) < live.size() && live[static_cast<size_t>(rank)] != 0;
}

}  // namespace

int WorkerNode::RelayFor(int rank) {
  DCHECK(loop()->InLoopThread());
  auto it = relays_.find(rank);
  if (it == relays_.end()) return -1;
  RelayRoute& route = it->second;
  const char* ended = nullptr;
  const std::string addr = ServerAddress(rank);
  if (addr.empty()) {
    ended = "no server holds that rank now";
  } else if (addr != route.addr) {
    ended = "it has another address now";
  } else if (!IsLive(live_, rank) || timed_out_servers_.count(route.addr) != 0) {
    ended = "the scheduler lost it too";
  } else if (!CanRelay(route.via)) {
    // The relaying server left or was lost: the next live one carries the route on.
    const int next = NextRelay(rank, route.via);
    if (next >= 0) {
      LOG(WARNING) << options_.node_id << ": server " << ServerName(route.via) << " relays no more; requests for "
                   << ServerName(rank) << " go through " << ServerName(next);
      route.via = next;
      return next;
    }
    ended = "no other live server is left to relay";
  }
  if (ended == nullptr) return route.via;
  LOG(WARNING) << options_.node_id << ": requests for server rank " << rank << " go to it directly again: " << ended;
  relays_.erase(it);
  UpdateRoute();
  return -1;
}

bool WorkerNode::CanRelay(int rank) const {
  DCHECK(loop()->InLoopThread());
  if (!IsLive(live_, rank)) return false;
  const std::string addr = ServerAddress(rank);
  return !addr.empty() && timed_out_servers_.count(addr) == 0;
}

int WorkerNode::NextRelay(int target, int after) const {
  DCHECK(loop()->InLoopThread());
  const int n = static_cast<int>(live_.size());
  for (int step = 1; step < n; ++step) {
    const int r = (after + step) % n;
    if (r != target && CanRelay(r)) return r;
  }
  return -1;
}

void WorkerNode::RouteAround(const KvPart& part, const Status& why) {
  DCHECK(loop()->InLoopThread());
  const int target = part.target;
  // Only a server the metadata still lists live at the address the part went to: a lost
  // one is the scheduler's to time out (and its ranges' backups', with replicas).
  if (part.addr.empty() || ServerAddress(target) != part.addr || !IsLive(live_, target) ||
      timed_out_servers_.count(part.addr) != 0) {
    return;
  }
  auto it = relays_.find(target);
  int after = target;
  if (it == relays_.end()) {
    // Sent directly, and no link to the server is open: the link died (a server that
    // answers, asking for a push again while it applies an earlier send, keeps it).
    if (part.via >= 0 || HasServerLink(part.addr)) return;
  } else {
    // Sent through the route's relay, whose own link from here died: the next server relays.
    if (part.via != it->second.via || HasServerLink(ServerAddress(part.via))) return;
    after = part.via;
  }
  const int via = NextRelay(target, after);
  if (via < 0 || (it != relays_.end() && via == it->second.via)) return;
  LOG(WARNING) << options_.node_id << ": server " << ServerName(target) << " cannot be reached from here (" << why
               << ") while the scheduler still hears it; its requests go through server " << ServerName(via);
  RelayRoute& route = relays_[target];
  route.via = via;
  route.addr = part.addr;
  UpdateRoute();  // PullSync's direct way leaves the keys to the relay
  WatchRelays();
}

void WorkerNode::WatchRelays() {
  DCHECK(loop()->InLoopThread());
  if (relay_timer_ != 0 || relays_.empty() || closed()) return;
  relay_timer_ = loop()->AddTimer(options_.heartbeat_interval, Duration::zero(), [this] {
    relay_timer_ = 0;
    ProbeRelays();
    WatchRelays();
  });
}

void WorkerNode::ProbeRelays() {
  DCHECK(loop()->InLoopThread());
  std::vector<int> targets;
  for (const auto& entry : relays_) targets.push_back(entry.first);
  for (int target : targets) {
    // A route whose target left (a scale-in renumbered or removed its rank), moved or was
    // lost ends here, though no part asks for that rank any more.
    if (RelayFor(target) < 0) continue;
    RelayRoute& route = relays_[target];
    if (route.probing || *route.in_flight != 0) continue;
    route.probing = true;
    // A direct link that answers a PING with nothing relayed in flight: parts sent on it
    // from now on cannot overtake a relayed one. The round trip, not the dial alone: a cut
    // may let a connection open and lose what goes over it. Dial and answer give up after
    // a heartbeat timeout each, so a probe started just before the cut is mended does not
    // hold the route for the kernel's SYN retries (seconds apart) or connect_timeout.
    WithServerConn(
        target,
        [this, target, addr = route.addr](Result<comm::ConnId> c) {
          if (!c.ok()) return OnProbed(target, addr, c.status());
          messenger().Call(*c, MakeMeta(pb::PING, pb::WORKER, loop_rank()), Buffer::Allocate(0),
                           options_.heartbeat_timeout, [this, target, addr](Result<comm::Frame> r) {
                             OnProbed(target, addr, r.ok() ? Status::Ok() : r.status());
                           });
        },
        options_.heartbeat_timeout);
  }
}

void WorkerNode::OnProbed(int target, const std::string& addr, const Status& answered) {
  DCHECK(loop()->InLoopThread());
  auto it = relays_.find(target);
  if (it == relays_.end() || it->second.addr != addr) return;
  it->second.probing = false;
  if (!answered.ok() || *it->second.in_flight != 0) return;
  // A warning as the route's start was: the pair tells an operator how long it lasted.
  LOG(WARNING) << options_.node_id << ": server " << ServerName(target)
               << " is reached directly again; its requests go to it directly";
  relays_.erase(it);
  UpdateRoute();
}

}  // namespace pscore::node
