// PeerAdmission: which peer links of a server belong to members of the job. A link starts
// with HELLO {node_id}; data is served only to nodes the metadata lists. A HELLO from a
// node the metadata does not list yet (the scheduler's broadcast may reach the peer
// first) is held, its link's frames queued, until the metadata lists it (then they are
// delivered in order) or the hold ends (then refused). Owned by ServerNode; loop thread
// only (every method asserts it).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/clock.h"

namespace pscore::node {

class PeerAdmission {
 public:
  struct Options {
    std::string node_id;  // this server's, for logs
    bool tls = false;     // a HELLO must name the node its certificate proves
    Duration hold{};      // how long a HELLO from a node not in the metadata is held
  };
  // `deliver` gets the frames queued behind a held HELLO once it is admitted.
  PeerAdmission(Options options, comm::EventLoop* loop, comm::Messenger* messenger,
                std::function<void(comm::ConnId, comm::Frame&&)> deliver);

  void HandleHello(comm::ConnId conn, const comm::Frame& frame);
  // A frame on a link whose HELLO is held: queued (bounded; past the bound the link is
  // refused) and true; false when the link is not held.
  bool QueueIfHeld(comm::ConnId conn, comm::Frame& frame);
  // Refuses (and closes) a request from a link that did not identify itself as a member;
  // true when the request may be served.
  bool CheckMember(comm::ConnId conn, const pb::MessageMeta& meta);
  bool IsMember(comm::ConnId conn) const;
  bool IsHeld(comm::ConnId conn) const;
  // The node ids of the metadata just applied: admits the held links they list.
  void SetMemberIds(std::unordered_set<std::string> ids);
  void OnClosed(comm::ConnId conn);
  void Stop();  // drops every held link's timer

 private:
  struct HeldHello {
    std::string node_id;
    pb::MessageMeta hello_meta;  // answered (when it asked for an answer) once decided
    comm::TimerId timer = 0;
    std::vector<comm::Frame> queued;
    uint64_t queued_bytes = 0;
  };
  void Hold(comm::ConnId conn, const pb::MessageMeta& hello_meta, const std::string& node_id);
  void Refuse(comm::ConnId conn, const pb::MessageMeta& meta, const Status& why);
  void RefuseHeld(comm::ConnId conn, const Status& why);
  // Removes conn's held HELLO (its timer cancelled) and returns it; nullopt if none.
  std::optional<HeldHello> TakeHeld(comm::ConnId conn);

  const Options options_;
  comm::EventLoop* const loop_;
  comm::Messenger* const messenger_;
  const std::function<void(comm::ConnId, comm::Frame&&)> deliver_;
  std::unordered_map<comm::ConnId, std::string> members_;  // identified peer links
  std::unordered_set<std::string> member_ids_;             // every member of the current metadata
  std::unordered_map<comm::ConnId, HeldHello> held_;
};

}  // namespace pscore::node
