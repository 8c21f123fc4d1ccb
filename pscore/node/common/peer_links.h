// PeerLinks: a member's links to the servers named by its current metadata. A link is
// dialled on first use, opened with HELLO (servers serve data only to members of the job)
// and closed once its server leaves the membership. Owned by Node; loop thread only.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/clock.h"
#include "pscore/node/common/options.h"

namespace pscore::node {

class PeerLinks {
 public:
  // `options` and `messenger` belong to the owning Node and outlive this; `own_rank`
  // tells the node's rank now (a new link says HELLO with it).
  PeerLinks(const NodeOptions& options, comm::EventLoop* loop, comm::Messenger* messenger,
            std::function<int()> own_rank);
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // The address of server `rank` ("" if none), and whether an address belongs to a server.
  std::string Address(int rank) const;
  bool IsServerAddress(const std::string& addr) const;
  // The link to server `rank`, dialled on first use; cb gets it or why not. The caller waits
  // at most `connect_timeout` (zero: NodeOptions::connect_timeout), then gets kTimeout. One
  // dial per address serves every caller: one that joins a dial under way with a shorter
  // bound gives up alone when it passes (the dial goes on); a dial that gives up is made
  // again for the callers whose bounds have not passed yet.
  void Link(int rank, std::function<void(Result<comm::ConnId>)> cb, Duration connect_timeout = Duration::zero());
  // Follows new metadata: its servers' addresses; links to servers marked down close now,
  // links to servers that left close after request_timeout; dials to addresses that left end.
  void Apply(const pb::SendMetadataMessage& md);
  // Dials to addresses not in `current` end now with kUnavailable.
  void FailDialsNotIn(const std::set<std::string>& current);
  // Whether a link to `addr` is open now.
  bool Linked(const std::string& addr) const;
  // Closes the open link to `addr` now; its pending requests fail with `why`.
  void Close(const std::string& addr, const Status& why);
  // The node closes: pending timers are cancelled (a shared loop runs on), and a dial that
  // gives up is not made again.
  void CancelTimers();

 private:
  // A caller waiting for a dial.
  struct Waiter {
    uint64_t id = 0;
    TimePoint deadline;
    std::function<void(Result<comm::ConnId>)> cb;
    comm::TimerId timer = 0;  // its own give-up, when its deadline comes before the dial's
  };
  // A dial under way. A dial whose address left the membership is answered at once
  // (FailDialsNotIn); its late result is recognised by its serial and dropped.
  struct Dial {
    uint64_t serial = 0;
    TimePoint deadline;  // when the dial itself gives up
    std::vector<Waiter> waiters;
  };
  // Adds `w` to the dial to `addr`, starting one that gives up after `bound` (w's deadline)
  // if none is under way.
  void Wait(const std::string& addr, Waiter w, Duration bound);
  // Waiter `id` of dial `serial` to `addr` gives up: its bound passed before the dial ended.
  void GiveUp(const std::string& addr, uint64_t serial, uint64_t id);
  // The waiters of the dial to `addr`, taken out of dialing_ (their timers cancelled).
  std::vector<Waiter> TakeWaiters(std::map<std::string, Dial>::iterator d);
  void OnDialed(const std::string& addr, uint64_t serial, Result<comm::ConnId> r);
  // A new link: HELLO first, then it is the address's open link until it closes.
  void Adopt(const std::string& addr, comm::ConnId conn);
  // Links to servers outside `current` close once their requests had time to finish.
  void ScheduleLeaves(const std::set<std::string>& current);

  const NodeOptions& options_;
  comm::EventLoop* loop_;
  comm::Messenger* messenger_;
  std::function<int()> own_rank_;
  uint64_t epoch_ = 0;                         // of the metadata applied last
  std::map<int, std::string> server_addr_;    // rank -> ip:port
  // Links are keyed by address, not rank: when ranks are compacted a server keeps its
  // link, and requests in flight on it are never cut.
  std::map<std::string, comm::ConnId> server_conn_;  // ip:port -> open link
  // Links to servers that left the membership, closed when these timers fire.
  std::map<comm::ConnId, comm::TimerId> leave_timers_;
  std::map<std::string, Dial> dialing_;  // by address
  uint64_t dial_serial_ = 0;
  uint64_t waiter_serial_ = 0;
  bool closed_ = false;  // CancelTimers ran: no dial is made again
};

}  // namespace pscore::node
