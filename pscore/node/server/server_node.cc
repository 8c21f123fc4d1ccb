#include "pscore/node/server/server_node.h"

#include <algorithm>

#include "pscore/core/kv_codec.h"
#include "pscore/node/common/metrics_text.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {
// The newest metadata reaches every node in about one broadcast; a heartbeat answer
// carries it otherwise. A HELLO from a node not in it is held this long, then refused.
Duration HelloHold(const NodeOptions& options) {
  return std::clamp<Duration>(2 * options.heartbeat_interval, std::chrono::milliseconds(500),
                              std::chrono::seconds(3));
}
}  // namespace

ServerNode::ServerNode(NodeOptions options, core::ParamStore::Options store, comm::EventLoop* loop)
    : Node([&] {
        options.role = pb::SERVER;
        return options;
      }(), loop),
      executor_(options_.handler_threads > 0 ? std::make_unique<Executor>(options_.handler_threads) : nullptr),
      ownership_(options_.node_id),
      params_(ParamService::Options{options_.node_id, options_.data_dir, options_.journal_compact_bytes,
                                    options_.max_message_bytes},
              store, Node::loop(), &ownership_, this, copied_counter()),
      resync_(ReplicaResync::Options{options_.node_id, options_.max_message_bytes}, Node::loop(), executor_.get(),
              alive_.watch(), &ownership_, &params_, this,
              [this](std::function<void(const Status&)> answered) { ReportResynced(std::move(answered)); }),
      migration_(options_.node_id, Node::loop(), executor_.get(), alive_.watch(), &ownership_, &params_, this),
      admission_(PeerAdmission::Options{options_.node_id, options_.tls != nullptr, HelloHold(options_)},
                 Node::loop(), &messenger(),
                 [this](ConnId conn, Frame&& frame) { OnPeerRequest(conn, std::move(frame)); }),
      mailbox_(options_.node_id, Node::loop(), this) {
  params_.set_gate(&resync_);
  params_.set_on_journal_error([this, alive = alive_.watch()](const Status& why) {
    Node::loop()->Post([this, alive, why] {
      if (alive) OnJournalError(why);
    });
  });
  RegisterBuiltins();
}

ServerNode::~ServerNode() {
  Stop();
  alive_.Expire();
}

void ServerNode::OnJournalError(const Status& why) {
  DCHECK(loop()->InLoopThread());
  if (closed() || stepped_down_) return;
  bool elsewhere = false;
  {
    auto lock = ownership_.Share();
    elsewhere = ownership_.EveryRangeHeldElsewhere();
  }
  if (!elsewhere) return;  // the only copy of some range: refuse on, the disk may free up
  stepped_down_ = true;
  Status down(Code::kResourceExhausted, "server " + options_.node_id + " stepped down: its journal cannot write (" +
                                            why.message() + "); the other replicas of its key ranges serve them");
  LOG(ERROR) << down;
  StepDown(down);
}

void ServerNode::AppendRoleMetrics(MetricsText* m) const {
  m->Family("pscore_server_journal_errors_total", "counter",
            "Changes refused because the journal (--data_dir) could not write them; a worker sends such a push again.");
  m->Sample("pscore_server_journal_errors_total", "", journal_errors());
  m->Family("pscore_server_repeated_pushes_total", "counter",
            "Pushes that came again after they were applied, acknowledged without applying them again.");
  m->Sample("pscore_server_repeated_pushes_total", "", repeated_pushes());
  m->Family("pscore_server_relayed_requests_total", "counter",
            "Pushes and pulls of workers that cannot reach their keys' server, forwarded there by this one.");
  m->Sample("pscore_server_relayed_requests_total", "", relayed_requests());
  m->Family("pscore_server_relay_failures_total", "counter",
            "Relayed requests answered with an error (the target's, or its link's).");
  m->Sample("pscore_server_relay_failures_total", "", relay_failures());
}

void ServerNode::RegisterBuiltins() {
  RegisterHandler(kPushHandler, [this](const DataRequest& req, Responder r) { params_.HandlePush(req, r, false); });
  RegisterHandler(kReplicateHandler,
                  [this](const DataRequest& req, Responder r) { params_.HandlePush(req, r, true); });
  RegisterHandler(kPullHandler, [this](const DataRequest& req, Responder r) { params_.HandlePull(req, r); });
  RegisterHandler(kMigrateHandler,
                  [this](const DataRequest& req, Responder r) { migration_.HandleEntries(req, r); });
  RegisterHandler(kMigrateWindowHandler,
                  [this](const DataRequest& req, Responder r) { migration_.HandleWindow(req, r); });
  RegisterHandler(kResyncHandler, [this](const DataRequest& req, Responder r) { resync_.HandleFetch(req, r); });
}

void ServerNode::RegisterHandler(int user_cmd, DataHandler handler) { by_cmd_[user_cmd] = std::move(handler); }

void ServerNode::RegisterHandler(const std::string& name, DataHandler handler) {
  by_name_[name] = std::move(handler);
}

Status ServerNode::StartRole() {
  PSCORE_RETURN_IF_ERROR(params_.Open());
  Result<int> port = messenger().transport().Listen(options_.host, options_.port);
  if (!port.ok()) return port.status();
  listen_port_ = *port;
  LOG(INFO) << "server " << options_.node_id << " listening on " << options_.host << ":" << listen_port_;
  return Status::Ok();
}

void ServerNode::OnStopCalled() {
  if (executor_) executor_->ReleaseCallingLane();
}

void ServerNode::StopRole() {
  DCHECK(loop()->InLoopThread());
  LOG(INFO) << "server " << options_.node_id << ": " << streamed_pushes()
            << " pushes folded into the store as they arrived";
  admission_.Stop();
  resync_.Stop();
  if (executor_) executor_->Shutdown();
  params_.Stop();
  mailbox_.Stop();
}

Responder ServerNode::MakeResponder(ConnId conn, const pb::MessageMeta& meta) {
  return Responder::Make(loop(), alive_.watch(), [this, conn, request = comm::Messenger::ReplyTo(meta)](
                                                     const Status& st, Payload payload) {
    Status sent = messenger().Reply(conn, request, st, std::move(payload));
    if (!sent.ok()) VLOG(1) << "server " << options_.node_id << ": answer not sent: " << sent;
  });
}

void ServerNode::OnPeerRequest(ConnId conn, Frame&& frame) {
  DCHECK(loop()->InLoopThread());
  // Waiting for the metadata to list the sender: the frames are kept, in order, bounded.
  if (frame.meta.cmd() != pb::HELLO && admission_.QueueIfHeld(conn, frame)) return;
  switch (frame.meta.cmd()) {
    case pb::HELLO: admission_.HandleHello(conn, frame); break;
    case pb::SEND_DATA:
      if (!admission_.CheckMember(conn, frame.meta)) break;
      if (frame.meta.has_relay_rank()) {
        Relay(conn, std::move(frame));
      } else {
        Dispatch(conn, std::move(frame));
      }
      break;
    case pb::COLLECTIVE_SEND_DATA:
      if (admission_.CheckMember(conn, frame.meta)) {
        BufferPtr payload = frame.payload ? frame.payload : Buffer::Allocate(0);
        Status st = mailbox_.Deliver(frame.meta.rank_id(), frame.meta.tag(), std::move(payload));
        messenger().Reply(conn, frame.meta, st).IgnoreError();
      }
      break;
    case pb::PING: messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError(); break;
    default: Node::OnPeerRequest(conn, std::move(frame));
  }
}

void ServerNode::OnPeerClosed(ConnId conn, const Status&) {
  DCHECK(loop()->InLoopThread());
  admission_.OnClosed(conn);
  in_executor_.erase(conn);  // closures still queued keep their counter alive
}

void ServerNode::CallServer(int rank, pb::MessageMeta meta, BufferPtr payload,
                            std::function<void(Result<Frame>)> done) {
  DCHECK(loop()->InLoopThread());
  WithServerConn(rank, [this, meta = std::move(meta), payload, done = std::move(done)](Result<ConnId> c) mutable {
    if (!c.ok()) return done(c.status());
    meta.set_role(pb::SERVER);
    meta.set_rank_id(Node::rank());
    messenger().Call(*c, std::move(meta), payload, options_.request_timeout, std::move(done));
  });
}

void ServerNode::Relay(ConnId conn, Frame&& frame) {
  DCHECK(loop()->InLoopThread());
  pb::MessageMeta meta = std::move(frame.meta);
  const int target = meta.relay_rank();
  meta.clear_relay_rank();
  if (target == loop_rank()) {  // a worker's stale route: the keys are this server's own
    frame.meta = std::move(meta);
    return Dispatch(conn, std::move(frame));
  }
  if (meta.handler() != kPushHandler && meta.handler() != kPullHandler) {
    messenger()
        .Reply(conn, meta, Status(Code::kInvalidArgument, "server " + options_.node_id +
                                                              " relays only built-in pushes and pulls, not '" +
                                                              meta.handler() + "'"))
        .IgnoreError();
    return;
  }
  const pb::MessageMeta request = comm::Messenger::ReplyTo(meta);
  meta.clear_request_id();
  meta.clear_payload_head();
  BufferPtr payload = frame.payload ? std::move(frame.payload) : Buffer::Allocate(0);
  relayed_.fetch_add(1, std::memory_order_relaxed);
  // The worker's own role and rank stay on the request: the target serves it as the
  // worker's (its push id included), on this server's link, behind the worker's earlier
  // relayed requests.
  WithServerConn(target, [this, conn, request, target, meta = std::move(meta),
                          payload = std::move(payload)](Result<ConnId> c) mutable {
    // The target's answer, error or not, goes back as it came; a lost link to it is
    // kUnavailable or kTimeout, which the worker takes as a loss and sends the part again.
    auto answer = [this, conn, request](Result<Frame> r) {
      if (!r.ok()) relay_failures_.fetch_add(1, std::memory_order_relaxed);
      Payload body = r.ok() && r->payload ? Payload(std::move(r->payload)) : Payload();
      messenger().Reply(conn, request, r.status(), std::move(body)).IgnoreError();
    };
    if (!c.ok()) {
      return answer(Status(Code::kUnavailable, "relay through server " + options_.node_id + " to server rank " +
                                                   std::to_string(target) + ": " + c.status().ToString()));
    }
    messenger().Call(*c, std::move(meta), std::move(payload), options_.request_timeout, std::move(answer));
  });
}

void ServerNode::Dispatch(ConnId conn, Frame&& frame) {
  DCHECK(loop()->InLoopThread());
  const pb::MessageMeta& meta = frame.meta;
  if (cluster_state() == pb::CLUSTER_DISABLE_FLS) {
    messenger().Reply(conn, meta, Status(Code::kUnavailable, "server " + options_.node_id + " is disabled"))
        .IgnoreError();
    return;
  }
  if (frame.stream) {
    Status st = params_.CommitStreamedPush(frame);
    messenger().Reply(conn, meta, st).IgnoreError();
    return;
  }
  const DataHandler* handler = nullptr;
  if (!meta.handler().empty()) {
    auto it = by_name_.find(meta.handler());
    if (it != by_name_.end()) handler = &it->second;
  } else {
    auto it = by_cmd_.find(meta.user_cmd());
    if (it != by_cmd_.end()) handler = &it->second;
  }
  if (handler == nullptr) {
    std::string what = meta.handler().empty() ? "user_cmd " + std::to_string(meta.user_cmd())
                                              : "handler '" + meta.handler() + "'";
    messenger().Reply(conn, meta, Status(Code::kNotFound, "server " + options_.node_id + " has no " + what))
        .IgnoreError();
    return;
  }
  DataRequest req{meta.role(), meta.rank_id(), meta.user_cmd(), meta.handler(), std::move(frame.payload),
                  PushIdOf(meta)};
  RunHandler(conn, meta, *handler, std::move(req));
}

void ServerNode::RunHandler(ConnId conn, const pb::MessageMeta& meta, const DataHandler& handler,
                            DataRequest req) {
  DCHECK(loop()->InLoopThread());
  Responder r = MakeResponder(conn, meta);
  if (!executor_) return handler(req, r);
  // Built-in push/pull of a few KiB take microseconds: on the loop thread at once, unless
  // earlier requests of this link are still with the executor (they go first).
  std::shared_ptr<std::atomic<int>>& pending = in_executor_[conn];
  if (!pending) pending = std::make_shared<std::atomic<int>>(0);
  if (pending->load(std::memory_order_acquire) == 0 && params_.SmallBuiltin(meta, req.payload)) {
    return handler(req, r);
  }
  pending->fetch_add(1, std::memory_order_relaxed);
  executor_->Submit(conn, [h = handler, req = std::move(req), r, pending] {
    h(req, r);
    pending->fetch_sub(1, std::memory_order_release);
  });
}

std::shared_ptr<comm::TailStream> ServerNode::OnRequestStream(ConnId conn, const pb::MessageMeta& meta,
                                                              uint64_t tail) {
  DCHECK(loop()->InLoopThread());
  // Large pushes of the built-in store only, from a member, served in order: no earlier
  // request of the link still with the handler threads, no journal (it logs whole pushes).
  // Every key of a streamed push holds core::kZeroCopyBytes or more (PushTail::Begin): a
  // head of more keys than the tail could give that much (a ZPush of small rows to a job of
  // one server) is declined before it is read, so the payload is received whole into one
  // buffer instead of one grown past its head.
  const uint64_t fewest_keys = std::max<uint64_t>(1, core::FewestKeysInHead(meta.payload_head()));
  if (meta.cmd() != pb::SEND_DATA || meta.handler() != kPushHandler || meta.has_relay_rank() ||
      tail / core::kZeroCopyBytes < fewest_keys) {
    return nullptr;
  }
  // Handlers on the loop thread (no executor) would wait there for the stream: none then.
  if (!executor_ || params_.journaled() || !admission_.IsMember(conn) || admission_.IsHeld(conn) ||
      cluster_state() == pb::CLUSTER_DISABLE_FLS) {
    return nullptr;
  }
  {
    // A replicated push is forwarded whole to the backups: received whole.
    auto lock = ownership_.Share();
    if (ownership_.view().replicas > 1) return nullptr;
  }
  auto pending = in_executor_.find(conn);
  if (pending != in_executor_.end() && pending->second->load(std::memory_order_acquire) != 0) return nullptr;
  return params_.NewPushTail();
}

void ServerNode::RefreshMemberIds() {
  std::unordered_set<std::string> ids;
  for (pb::NodeRole role : {pb::WORKER, pb::SERVER}) {
    for (std::string& id : NodeIds(role)) ids.insert(std::move(id));
  }
  admission_.SetMemberIds(std::move(ids));
}

void ServerNode::OnMetadataApplied() {
  DCHECK(loop()->InLoopThread());
  RefreshView();
  RefreshMemberIds();  // admits held links: their queued frames are served under the new view
}

void ServerNode::OnStateApplied(pb::ClusterState) { RefreshView(); }

KeyView ServerNode::ViewOf(const pb::SendMetadataMessage& md, bool* self_resyncing) const {
  KeyView v;
  v.rank = md.rank_id();
  v.n = md.server_num();
  v.replicas = std::max(1, md.replicas());
  // Which servers hold their ranges' copies: not those timed out or back after a loss.
  v.live.assign(static_cast<size_t>(std::max(v.n, 0)), 1);
  v.resyncing.assign(static_cast<size_t>(std::max(v.n, 0)), 0);
  *self_resyncing = false;
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.role() != pb::SERVER || s.rank_id() < 0 || s.rank_id() >= v.n) continue;
    v.live[s.rank_id()] = s.is_alive() ? 1 : 0;
    v.resyncing[s.rank_id()] = v.replicas >= 2 && s.resyncing() ? 1 : 0;
    if (s.node_id() == options_.node_id) *self_resyncing = v.resyncing[s.rank_id()] != 0;
  }
  return v;
}

void ServerNode::RefreshView() {
  DCHECK(loop()->InLoopThread());
  // Only a started cluster that does not scale settles the view: a scale switches it
  // through KeyMigration.
  if (!scale().settled()) return;
  pb::SendMetadataMessage md = metadata();
  bool self_resyncing = false;
  KeyView view = ViewOf(md, &self_resyncing);
  const int rank = view.rank;
  const int n = view.n;
  const int replicas = view.replicas;
  bool changed;
  std::vector<std::pair<int, int>> fetches;
  {
    auto lock = ownership_.Exclusive();
    changed = ownership_.Settle(std::move(view));
    fetches = resync_.UpdateLocked(self_resyncing);
  }
  if (!fetches.empty()) resync_.StartFetches(std::move(fetches));
  mailbox_.OnServerCount(n);
  auto logged = [id = options_.node_id, rank, n, replicas, changed](size_t dropped) {
    if (!changed && dropped == 0) return;
    LOG(INFO) << "server " << id << " serves key range " << rank << "/" << n
              << (replicas > 1 ? " (replicas " + std::to_string(replicas) + ")" : "")
              << (dropped ? " (dropped " + std::to_string(dropped) + " keys owned elsewhere)" : "");
  };
  migration_.DropNotHeld(rank, n, replicas, changed, std::move(logged));
}

void ServerNode::OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) {
  migration_.OnScaleOutReady(md, std::move(done));
}

void ServerNode::OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) {
  migration_.OnScaleInStart(metadata(), msg, std::move(done));
}

void ServerNode::OnClusterEvent(const pb::ClusterEventMessage& ev) {
  DCHECK(loop()->InLoopThread());
  if (ev.role() != pb::SERVER || ev.rank_id() < 0) return;
  const int rank = ev.rank_id();
  switch (ev.kind()) {
    case pb::ClusterEventMessage::NODE_TIMED_OUT:
      mailbox_.OnServerLost(rank, Status(Code::kUnavailable, "server rank " + std::to_string(rank) + " (" +
                                                                 ev.node_id() +
                                                                 ") timed out: nothing more will come from it"));
      break;
    case pb::ClusterEventMessage::NODE_RECOVERED:
    case pb::ClusterEventMessage::NODE_RESTARTED:
      mailbox_.OnServerBack(rank);
      break;
    default:
      break;
  }
}

void ServerNode::ReportResynced(std::function<void(const Status&)> answered) {
  DCHECK(loop()->InLoopThread());
  pb::ResyncDoneMessage msg;
  msg.set_node_id(options_.node_id);
  msg.set_incarnation(incarnation());
  CallSchedulerAsync(pb::RESYNC_DONE, msg, options_.request_timeout,
                     [answered = std::move(answered)](Result<Frame> res) { answered(res.status()); });
}

std::future<Status> ServerNode::CollectiveSend(int rank, const std::string& tag, BufferPtr payload) {
  return mailbox_.Send(rank, tag, std::move(payload));
}

std::future<Result<BufferPtr>> ServerNode::CollectiveRecv(int rank, const std::string& tag) {
  return mailbox_.Recv(rank, tag);
}

Status ServerNode::AllReduce(const std::string& tag, std::vector<float>* data, Duration timeout) {
  return mailbox_.AllReduce(rank(), server_num(), tag, data, timeout);
}

}  // namespace pscore::node
