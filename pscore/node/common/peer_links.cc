#include "pscore/node/common/peer_links.h"

#include <algorithm>
#include <utility>

#include "pscore/comm/address.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;

PeerLinks::PeerLinks(const NodeOptions& options, comm::EventLoop* loop, comm::Messenger* messenger,
                     std::function<int()> own_rank)
    : options_(options), loop_(loop), messenger_(messenger), own_rank_(std::move(own_rank)) {}

std::string PeerLinks::Address(int rank) const {
  DCHECK(loop_->InLoopThread());
  auto a = server_addr_.find(rank);
  return a == server_addr_.end() ? std::string() : a->second;
}

bool PeerLinks::IsServerAddress(const std::string& addr) const {
  DCHECK(loop_->InLoopThread());
  for (auto& [rank, a] : server_addr_) {
    if (a == addr) return true;
  }
  return false;
}

bool PeerLinks::Linked(const std::string& addr) const {
  DCHECK(loop_->InLoopThread());
  auto open = server_conn_.find(addr);
  return open != server_conn_.end() && messenger_->transport().IsOpen(open->second);
}

void PeerLinks::Link(int rank, std::function<void(Result<ConnId>)> cb, Duration connect_timeout) {
  DCHECK(loop_->InLoopThread());
  auto a = server_addr_.find(rank);
  if (a == server_addr_.end()) {
    return cb(Status(Code::kNotFound, "no server of rank " + std::to_string(rank) + " in the metadata (epoch " +
                                          std::to_string(epoch_) + ")"));
  }
  const std::string addr = a->second;
  auto open = server_conn_.find(addr);
  if (open != server_conn_.end() && messenger_->transport().IsOpen(open->second)) {
    cb(open->second);
    return;
  }
  const Duration bound = connect_timeout > Duration::zero() ? connect_timeout : options_.connect_timeout;
  Wait(addr, Waiter{++waiter_serial_, SteadyClock().Now() + bound, std::move(cb)}, bound);
}

void PeerLinks::Wait(const std::string& addr, Waiter w, Duration bound) {
  DCHECK(loop_->InLoopThread());
  auto [d, fresh] = dialing_.try_emplace(addr);
  Dial& dial = d->second;
  if (!fresh) {
    if (w.deadline < dial.deadline) {
      w.timer = loop_->AddTimer(bound, Duration::zero(),
                                [this, addr, serial = dial.serial, id = w.id] { GiveUp(addr, serial, id); });
    }
    dial.waiters.push_back(std::move(w));
    return;
  }
  dial.serial = ++dial_serial_;
  dial.deadline = w.deadline;
  dial.waiters.push_back(std::move(w));
  const uint64_t serial = dial.serial;
  Result<comm::HostPort> where = comm::ParseHostPort(addr);
  if (!where.ok()) return OnDialed(addr, serial, where.status());
  comm::ConnectOptions co;
  co.timeout = bound;
  // A link that stops carrying acknowledgements for twice the heartbeat timeout is taken
  // as cut and closed: the scheduler would have timed a silent server out by then, and a
  // server it still hears is reached through another one (docs/reliability.md, Partial
  // partitions). Twice: a server that drains its socket slowly for a while is not cut off.
  co.user_timeout = 2 * options_.heartbeat_timeout;
  messenger_->transport().Connect(where->host, where->port, co,
                                  [this, addr, serial](Result<ConnId> r) { OnDialed(addr, serial, std::move(r)); });
}

void PeerLinks::GiveUp(const std::string& addr, uint64_t serial, uint64_t id) {
  DCHECK(loop_->InLoopThread());
  auto d = dialing_.find(addr);
  if (d == dialing_.end() || d->second.serial != serial) return;
  std::vector<Waiter>& waiters = d->second.waiters;
  auto w = std::find_if(waiters.begin(), waiters.end(), [id](const Waiter& x) { return x.id == id; });
  if (w == waiters.end()) return;
  auto cb = std::move(w->cb);
  waiters.erase(w);
  cb(Status(Code::kTimeout, "connect to " + addr + ": no link within this call's bound (a dial to it goes on)"));
}

std::vector<PeerLinks::Waiter> PeerLinks::TakeWaiters(std::map<std::string, Dial>::iterator d) {
  std::vector<Waiter> waiters = std::move(d->second.waiters);
  dialing_.erase(d);
  for (Waiter& w : waiters) {
    if (w.timer != 0) loop_->CancelTimer(w.timer);
  }
  return waiters;
}

void PeerLinks::OnDialed(const std::string& addr, uint64_t serial, Result<ConnId> r) {
  DCHECK(loop_->InLoopThread());
  auto d = dialing_.find(addr);
  if (d == dialing_.end() || d->second.serial != serial) {
    // Answered already: the address left the membership while this dial ran.
    if (r.ok()) messenger_->transport().Close(*r, Status(Code::kCancelled, "server left the membership"));
    return;
  }
  const TimePoint gave_up = d->second.deadline;
  std::vector<Waiter> waiters = TakeWaiters(d);
  if (r.ok()) Adopt(addr, *r);
  // The dial gave up at its own bound: callers who joined it with longer bounds wait on for
  // a new one, the longest first (it bounds the new dial; the others join it with timers).
  std::vector<Waiter> done;
  if (!r.ok() && r.status().code() == Code::kTimeout && !closed_) {
    std::sort(waiters.begin(), waiters.end(), [](const Waiter& x, const Waiter& y) { return x.deadline > y.deadline; });
    for (Waiter& w : waiters) {
      if (w.deadline > gave_up + std::chrono::milliseconds(10)) {
        w.timer = 0;
        const Duration left = w.deadline - SteadyClock().Now();
        Wait(addr, std::move(w), left);
      } else {
        done.push_back(std::move(w));
      }
    }
  } else {
    done = std::move(waiters);
  }
  for (Waiter& w : done) w.cb(r);
}

void PeerLinks::Adopt(const std::string& addr, ConnId conn) {
  DCHECK(loop_->InLoopThread());
  // Say who we are first: servers serve data only to members of the job.
  const int own_rank = own_rank_();
  pb::HelloMessage hello;
  hello.set_node_id(options_.node_id);
  hello.set_role(options_.role);
  hello.set_rank_id(own_rank);
  messenger_->Notify(conn, MakeMeta(pb::HELLO, options_.role, own_rank), ToBuffer(hello)).IgnoreError();
  server_conn_[addr] = conn;
  messenger_->transport().WatchClose(conn, [this, addr, conn](const Status&) {
    auto it = server_conn_.find(addr);
    if (it != server_conn_.end() && it->second == conn) server_conn_.erase(it);
  });
}

void PeerLinks::Apply(const pb::SendMetadataMessage& md) {
  DCHECK(loop_->InLoopThread());
  epoch_ = md.epoch();
  std::map<int, std::string> addrs;
  std::set<std::string> current;
  std::map<std::string, std::string> down;  // address -> node id of a server marked down
  for (const pb::ServersMeta& s : md.servers_meta()) {
    const std::string addr = comm::JoinHostPort(s.ip(), s.port());
    addrs[s.rank_id()] = addr;
    // Replicated ranges (docs/reliability.md): a server marked down is read and written no
    // more, so a dial to it ends at once and its ranges' next replica is used. A resyncing
    // one is still dialled: its ranges' primaries forward pushes to it.
    if (md.replicas() >= 2 && !s.is_alive() && !s.resyncing()) {
      down[addr] = s.node_id();
      continue;
    }
    current.insert(addr);
  }
  // Its link is closed at once, too: a silent server (stopped, cut off) never closes it
  // itself, and requests in flight on it would wait out request_timeout. They fail
  // kUnavailable now and their callers send them to the range's new primary (a push keeps
  // its id: a late apply on the old primary is deduplicated wherever it is forwarded).
  for (const auto& [addr, id] : down) {
    if (server_conn_.count(addr) == 0) continue;
    Close(addr, Status(Code::kUnavailable, "server " + id + " (" + addr + ") marked down by the scheduler (epoch " +
                                               std::to_string(md.epoch()) + ")"));
  }
  ScheduleLeaves(current);
  server_addr_ = std::move(addrs);
  FailDialsNotIn(current);
}

// A leaving server usually exits first and closes its links itself.
void PeerLinks::ScheduleLeaves(const std::set<std::string>& current) {
  DCHECK(loop_->InLoopThread());
  for (auto& [addr, conn] : server_conn_) {
    if (current.count(addr) || leave_timers_.count(conn)) continue;
    const ConnId c = conn;
    // Cancelled by CancelTimers: on a shared loop the timer may outlive the node.
    leave_timers_[c] = loop_->AddTimer(options_.request_timeout, Duration::zero(), [this, c] {
      leave_timers_.erase(c);
      messenger_->transport().Close(c, Status(Code::kCancelled, "server left the membership"));
    });
  }
}

void PeerLinks::Close(const std::string& addr, const Status& why) {
  DCHECK(loop_->InLoopThread());
  auto it = server_conn_.find(addr);
  if (it == server_conn_.end()) return;
  const ConnId conn = it->second;
  server_conn_.erase(it);
  auto timer = leave_timers_.find(conn);
  if (timer != leave_timers_.end()) {
    loop_->CancelTimer(timer->second);
    leave_timers_.erase(timer);
  }
  LOG(WARNING) << options_.node_id << ": closing the link to " << addr << ": " << why;
  messenger_->transport().Close(conn, why);
}

void PeerLinks::FailDialsNotIn(const std::set<std::string>& current) {
  DCHECK(loop_->InLoopThread());
  for (auto d = dialing_.begin(); d != dialing_.end();) {
    if (current.count(d->first) != 0) {
      ++d;
      continue;
    }
    const std::string addr = d->first;
    std::vector<Waiter> waiters = TakeWaiters(d++);
    VLOG(1) << options_.node_id << ": dial to " << addr << " ended: the address left the membership";
    for (Waiter& w : waiters) {
      w.cb(Status(Code::kUnavailable, "server address " + addr + " left the membership while it was being dialed"));
    }
  }
}

void PeerLinks::CancelTimers() {
  DCHECK(loop_->InLoopThread());
  closed_ = true;
  for (auto& [conn, timer] : leave_timers_) loop_->CancelTimer(timer);
  leave_timers_.clear();
  // Dials under way end with the transport's shutdown; until then their callers wait
  // for them, not for timers of their own.
  for (auto& [addr, dial] : dialing_) {
    for (Waiter& w : dial.waiters) {
      if (w.timer != 0) loop_->CancelTimer(std::exchange(w.timer, 0));
    }
  }
}

}  // namespace pscore::node
