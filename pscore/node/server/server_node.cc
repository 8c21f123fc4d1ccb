#include "pscore/node/server/server_node.h"

#include <algorithm>
#include <atomic>

#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"

#define PSCORE_RETURN_IF_ERROR_RESPOND(expr, responder) \
  do {                                                  \
    ::pscore::Status _st = (expr);                      \
    if (!_st.ok()) return (responder).Fail(_st);        \
  } while (0)

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

struct Responder::State {
  comm::EventLoop* loop;
  std::weak_ptr<ServerNode*> server;
  std::function<void(const Status&, Payload)> send;  // runs on the loop thread
  std::atomic<bool> answered{false};

  void Answer(const Status& st, Payload payload) {
    if (answered.exchange(true)) return;
    auto fn = send;
    std::weak_ptr<ServerNode*> weak = server;
    loop->Run([weak, fn, st, payload = std::move(payload)]() mutable {
      if (weak.lock()) fn(st, std::move(payload));
    });
  }
  ~State() {
    if (!answered.load()) Answer(Status(Code::kInternal, "handler did not answer"), nullptr);
  }
};

void Responder::Reply(Payload payload) const { state_->Answer(Status::Ok(), std::move(payload)); }
void Responder::Fail(const Status& status) const { state_->Answer(status, nullptr); }

ServerNode::ServerNode(NodeOptions options, core::ParamStore::Options store, comm::EventLoop* loop)
    : Node([&] {
        options.role = pb::SERVER;
        return options;
      }(), loop),
      store_(store),
      alive_(std::make_shared<ServerNode*>(this)) {
  if (options_.handler_threads > 0) executor_ = std::make_unique<Executor>(options_.handler_threads);
  RegisterHandler(kPushHandler, [this](const DataRequest& req, Responder r) { HandlePush(req, r, false); });
  RegisterHandler(kReplicateHandler, [this](const DataRequest& req, Responder r) { HandlePush(req, r, true); });
  RegisterHandler(kPullHandler, [this](const DataRequest& req, Responder r) { HandlePull(req, r); });
  RegisterHandler(kMigrateHandler, [this](const DataRequest& req, Responder r) { HandleMigrate(req, r); });
  RegisterHandler(kMigrateWindowHandler, [this](const DataRequest& req, Responder r) {
    const std::string_view bytes = req.payload ? std::string_view(req.payload->data(), req.payload->size()) : "";
    Status st = dedup_.Merge(bytes);
    st.ok() ? r.Reply(nullptr) : r.Fail(st);
  });
  RegisterHandler(kResyncHandler, [this](const DataRequest& req, Responder r) { HandleResyncFetch(req, r); });
}

ServerNode::~ServerNode() {
  Stop();
  alive_.reset();
}

void ServerNode::RegisterHandler(int user_cmd, DataHandler handler) { by_cmd_[user_cmd] = std::move(handler); }

void ServerNode::RegisterHandler(const std::string& name, DataHandler handler) {
  by_name_[name] = std::move(handler);
}

Status ServerNode::StartRole() {
  if (!options_.data_dir.empty()) {
    ServerJournalOptions journal_options;
    journal_options.compact_floor = options_.journal_compact_bytes;
    journal_ = std::make_unique<ServerJournal>(options_.data_dir, journal_options);
    PSCORE_RETURN_IF_ERROR(journal_->Open(&store_, &dedup_));
    LOG(INFO) << "server " << options_.node_id << ": parameters journaled in " << journal_->path() << " ("
              << journal_->restored_keys() << " keys restored)";
    std::vector<uint64_t> keys = store_.Keys();
    std::lock_guard<std::mutex> lock(journal_mu_);
    restored_unconfirmed_.insert(keys.begin(), keys.end());
  }
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
  LOG(INFO) << "server " << options_.node_id << ": " << streamed_pushes()
            << " pushes folded into the store as they arrived";
  while (!held_.empty()) TakeHeld(held_.begin()->first);
  if (executor_) executor_->Shutdown();
  if (journal_) {
    // No handler appends any more; a compaction still being written ends here, so nothing
    // of this node touches data_dir once Stop has returned (the directory may be removed or
    // opened by a new server at once).
    std::lock_guard<std::mutex> lock(journal_mu_);
    Status st = journal_->FinishCompaction();
    if (!st.ok()) LOG(WARNING) << "server " << options_.node_id << ": journal compaction failed: " << st;
  }
  for (auto& [key, p] : waiting_) p->set_value(Status(Code::kCancelled, "server stopped"));
  waiting_.clear();
}

Responder ServerNode::MakeResponder(ConnId conn, const pb::MessageMeta& meta) {
  Responder r;
  r.state_ = std::make_shared<Responder::State>();
  r.state_->loop = loop();
  r.state_->server = alive_;
  r.state_->send = [this, conn, meta](const Status& st, Payload payload) {
    Status sent = messenger().Reply(conn, meta, st, std::move(payload));
    if (!sent.ok()) VLOG(1) << "server " << options_.node_id << ": answer not sent: " << sent;
  };
  return r;
}

void ServerNode::OnPeerRequest(ConnId conn, Frame&& frame) {
  if (auto held = held_.find(conn); held != held_.end() && frame.meta.cmd() != pb::HELLO) {
    // Waiting for the metadata to list the sender: keep the frames, in order, bounded.
    constexpr size_t kMaxHeldFrames = 1024;
    constexpr uint64_t kMaxHeldBytes = 64ull << 20;
    HeldHello& h = held->second;
    h.queued_bytes += frame.payload ? frame.payload->size() : 0;
    h.queued.push_back(std::move(frame));
    if (h.queued.size() > kMaxHeldFrames || h.queued_bytes > kMaxHeldBytes) {
      RefuseHeld(conn, Status(Code::kResourceExhausted, "node '" + h.node_id + "' sent " +
                                                            std::to_string(h.queued.size()) +
                                                            " frames before the metadata listed it"));
    }
    return;
  }
  switch (frame.meta.cmd()) {
    case pb::HELLO: HandleHello(conn, frame); break;
    case pb::SEND_DATA:
      if (CheckMember(conn, frame.meta)) Dispatch(conn, std::move(frame));
      break;
    case pb::COLLECTIVE_SEND_DATA:
      if (CheckMember(conn, frame.meta)) HandleCollective(conn, std::move(frame));
      break;
    case pb::PING: messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError(); break;
    default: Node::OnPeerRequest(conn, std::move(frame));
  }
}

// A peer link starts with HELLO {node_id}: data is served only to nodes in the job's
// metadata. (Without a cluster token the claim is not proven; with one, the connection
// has already proven the token.)
void ServerNode::HandleHello(ConnId conn, const Frame& frame) {
  pb::HelloMessage hello;
  Status st = ParsePayload(frame, &hello);
  if (st.ok() && options_.tls != nullptr) {
    // With TLS the node id a peer names must be the one its certificate proves.
    const std::string proven = messenger().transport().PeerIdentity(conn);
    if (proven != hello.node_id()) {
      st = Status(Code::kPermissionDenied,
                  "node '" + hello.node_id() + "' does not match the TLS certificate (CN=" + proven + ")");
    }
  }
  if (st.ok() && !IsMemberId(hello.node_id())) {
    if (!hello.node_id().empty() && !held_.count(conn)) return HoldHello(conn, frame.meta, hello.node_id());
    st = Status(Code::kPermissionDenied, "node '" + hello.node_id() + "' is not a member of this job");
  }
  if (!st.ok()) {
    LOG(WARNING) << "server " << options_.node_id << ": conn " << conn << " "
                 << messenger().transport().PeerAddress(conn) << " refused: " << st;
    messenger().Reply(conn, frame.meta, st).IgnoreError();
    messenger().transport().CloseAfterFlush(conn, st);
    return;
  }
  members_[conn] = hello.node_id();
  messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError();
}

bool ServerNode::journal_compacting() {
  std::lock_guard<std::mutex> lock(journal_mu_);
  return journal_ && journal_->compacting();
}

bool ServerNode::IsMemberId(const std::string& node_id) const { return member_ids_.count(node_id) != 0; }

void ServerNode::RefreshMemberIds() {
  member_ids_.clear();
  for (pb::NodeRole role : {pb::WORKER, pb::SERVER}) {
    for (std::string& id : NodeIds(role)) member_ids_.insert(std::move(id));
  }
}

void ServerNode::HoldHello(ConnId conn, const pb::MessageMeta& hello_meta, const std::string& node_id) {
  // The newest metadata reaches every node in about one broadcast; a heartbeat answer
  // carries it otherwise. Past that, the peer is not a member.
  const Duration hold = std::clamp<Duration>(2 * options_.heartbeat_interval, std::chrono::milliseconds(500),
                                             std::chrono::seconds(3));
  HeldHello& h = held_[conn];
  h.node_id = node_id;
  h.hello_meta = hello_meta;
  h.timer = loop()->AddTimer(hold, Duration::zero(), [this, conn, node_id, hold] {
    auto it = held_.find(conn);
    if (it == held_.end()) return;
    it->second.timer = 0;
    RefuseHeld(conn, Status(Code::kPermissionDenied, "node '" + node_id + "' is not a member of this job (not in " +
                                                         "the metadata after " + std::to_string(ToMillis(hold)) +
                                                         " ms)"));
  });
  VLOG(1) << "server " << options_.node_id << ": conn " << conn << " says it is '" << node_id
          << "', not in the metadata yet; holding it";
}

void ServerNode::RecheckHeldHellos() {
  std::vector<ConnId> admitted;
  for (auto& [conn, h] : held_) {
    if (IsMemberId(h.node_id)) admitted.push_back(conn);
  }
  for (ConnId conn : admitted) {
    std::optional<HeldHello> h = TakeHeld(conn);
    if (!h) continue;
    members_[conn] = h->node_id;
    messenger().Reply(conn, h->hello_meta, Status::Ok()).IgnoreError();
    for (Frame& f : h->queued) {
      if (!messenger().transport().IsOpen(conn)) break;
      OnPeerRequest(conn, std::move(f));
    }
  }
}

std::optional<ServerNode::HeldHello> ServerNode::TakeHeld(ConnId conn) {
  auto it = held_.find(conn);
  if (it == held_.end()) return std::nullopt;
  HeldHello h = std::move(it->second);
  held_.erase(it);
  if (h.timer != 0) loop()->CancelTimer(h.timer);
  return h;
}

void ServerNode::RefuseHeld(ConnId conn, const Status& why) {
  std::optional<HeldHello> h = TakeHeld(conn);
  if (!h) return;
  LOG(WARNING) << "server " << options_.node_id << ": conn " << conn << " "
               << messenger().transport().PeerAddress(conn) << " refused: " << why;
  messenger().Reply(conn, h->hello_meta, why).IgnoreError();
  for (const Frame& f : h->queued) messenger().Reply(conn, f.meta, why).IgnoreError();
  messenger().transport().CloseAfterFlush(conn, why);
}

bool ServerNode::CheckMember(ConnId conn, const pb::MessageMeta& meta) {
  if (members_.count(conn)) return true;
  Status why(Code::kPermissionDenied, "peer " + messenger().transport().PeerAddress(conn) +
                                         " sent " + pb::NodeCommand_Name(meta.cmd()) +
                                         " without identifying itself as a member (HELLO)");
  LOG_EVERY_N(WARNING, 100) << "server " << options_.node_id << ": " << why;
  messenger().Reply(conn, meta, why).IgnoreError();
  messenger().transport().CloseAfterFlush(conn, why);
  return false;
}

void ServerNode::OnPeerClosed(ConnId conn, const Status&) {
  members_.erase(conn);
  in_executor_.erase(conn);  // closures still queued keep their counter alive
  TakeHeld(conn);
}

void ServerNode::Dispatch(ConnId conn, Frame&& frame) {
  const pb::MessageMeta& meta = frame.meta;
  if (cluster_state() == pb::CLUSTER_DISABLE_FLS) {
    messenger().Reply(conn, meta, Status(Code::kUnavailable, "server " + options_.node_id + " is disabled"))
        .IgnoreError();
    return;
  }
  if (frame.stream) return CommitStreamedPush(conn, std::move(frame));
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
  DataRequest req{meta.role(), meta.rank_id(), meta.user_cmd(), meta.handler(), std::move(frame.payload), {}};
  if (meta.has_push_id()) {
    req.push_id = core::PushId{meta.push_id().writer(), meta.push_id().incarnation(), meta.push_id().seq(),
                               meta.push_id().origin_seq()};
  }
  Responder r = MakeResponder(conn, meta);
  if (!executor_) return (*handler)(req, r);
  // Built-in push/pull of a few KiB take microseconds: on the loop thread at once, unless
  // earlier requests of this link are still with the executor (they go first).
  std::shared_ptr<std::atomic<int>>& pending = in_executor_[conn];
  if (!pending) pending = std::make_shared<std::atomic<int>>(0);
  if (pending->load(std::memory_order_acquire) == 0 && SmallBuiltin(meta, req.payload)) {
    return (*handler)(req, r);
  }
  pending->fetch_add(1, std::memory_order_relaxed);
  DataHandler h = *handler;
  executor_->Submit(conn, [h, req = std::move(req), r, pending] {
    h(req, r);
    pending->fetch_sub(1, std::memory_order_release);
  });
}

bool ServerNode::SmallBuiltin(const pb::MessageMeta& meta, const BufferPtr& payload) const {
  constexpr size_t kSmallBytes = 16 * 1024;
  const bool push = meta.handler() == kPushHandler || meta.handler() == kReplicateHandler;
  if (!push && meta.handler() != kPullHandler) return false;
  const size_t size = payload ? payload->size() : 0;
  if (size > kSmallBytes) return false;
  // A journaled push writes to disk, and now and then compacts the journal (the whole
  // store, then fsync): never on the loop thread.
  if (push) return !journal_;
  // A pull's answer is what counts: the lengths of the keys it asks for. A small one is
  // copied in microseconds; a large one of a few keys is not copied at all (written from
  // the store: HandlePull), so it costs a few lookups whatever its size.
  constexpr size_t kFewKeys = 16;
  Result<core::KvView> view = core::DecodeKvPairs(payload ? payload->data() : "", size, /*expect_values=*/false);
  if (!view.ok()) return true;  // refused at once by the handler
  std::vector<uint32_t> lens(view->num_keys);
  if (!store_.Lens(view->keys, view->num_keys, lens.data()).ok()) return true;  // kNotFound at once
  uint64_t floats = 0;
  for (uint32_t l : lens) floats += l;
  const uint64_t bytes = floats * sizeof(float);
  return bytes <= kSmallBytes || (view->num_keys <= kFewKeys && bytes >= core::kZeroCopyBytes * view->num_keys);
}

Status ServerNode::Journaled(core::JournalOp op, std::string_view body, const std::function<Status()>& apply) {
  if (!journal_) return apply();
  // The checksum first, outside the lock: another handler thread writes meanwhile.
  return JournaledRecord(core::JournalRecordHeader(op, body), body, apply);
}

Status ServerNode::JournaledRecord(const std::string& header, std::string_view body,
                                   const std::function<Status()>& apply) {
  std::lock_guard<std::mutex> lock(journal_mu_);
  Status logged = journal_->AppendRecord(header, body);
  if (!logged.ok()) {
    LOG(ERROR) << "server " << options_.node_id << ": " << logged;
    return Status(Code::kUnavailable, "server " + options_.node_id + " cannot journal the change: " + logged.message());
  }
  Status st = apply();
  // The loop thread (a view change's drop, inline handlers) must not wait for the disk:
  // a stalled loop misses its heartbeats.
  journal_->MaybeCompact(/*may_wait=*/!loop()->InLoopThread());
  return st;
}

void ServerNode::HandlePull(const DataRequest& req, Responder r) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/false);
  if (!view.ok()) return r.Fail(view.status());
  std::shared_lock<std::shared_mutex> lock(view_mu_);
  PSCORE_RETURN_IF_ERROR_RESPOND(CheckOwned(view->keys, view->num_keys), r);
  std::vector<uint32_t> lens(view->num_keys);
  PSCORE_RETURN_IF_ERROR_RESPOND(store_.Lens(view->keys, view->num_keys, lens.data()), r);
  uint64_t total = 0;
  for (uint32_t l : lens) total += l;
  // An answer over the frame limit would be refused by the worker (its link closed), and
  // one of 2 GiB or more cannot be encoded at all: refused here, whole. Keys may repeat
  // in a request, so a small request can ask for a huge answer.
  const uint64_t answer_bytes = total * sizeof(float) + uint64_t{view->num_keys} * (sizeof(uint64_t) + sizeof(uint32_t));
  if (answer_bytes > options_.max_message_bytes) {
    return r.Fail(Status(Code::kResourceExhausted, "pull: the answer would hold " + std::to_string(answer_bytes) +
                                                       " bytes of keys and values, over max_message_bytes (" +
                                                       std::to_string(options_.max_message_bytes) + ")"));
  }
  if (total * sizeof(float) >= core::kSharedAnswerBytes * view->num_keys) {
    // Values of a few KiB a key and more are not copied: the answer's tail is the stored
    // memory itself, pinned until the answer is written (a push meanwhile writes a fresh
    // copy of the key).
    std::vector<Slice> values(view->num_keys);
    PSCORE_RETURN_IF_ERROR_RESPOND(store_.ShareValues(view->keys, view->num_keys, values.data()), r);
    lock.unlock();
    for (size_t i = 0; i < values.size(); ++i) lens[i] = static_cast<uint32_t>(values[i].size / sizeof(float));
    Result<Payload> answer = core::EncodeKvPairsShared(view->keys, view->num_keys, lens.data(), std::move(values));
    if (!answer.ok()) return r.Fail(answer.status());
    return r.Reply(std::move(*answer));
  }
  // Smaller ones are copied once: from the store straight into the answer.
  Result<BufferPtr> answer = core::EncodeKvPairsFilled(
      view->keys, view->num_keys, lens.data(), total,
      [&](float* dst) { return store_.CopyValues(view->keys, view->num_keys, lens.data(), dst); });
  lock.unlock();
  if (!answer.ok()) return r.Fail(answer.status());
  CountCopied(total * sizeof(float));
  r.Reply(*answer);
}

void ServerNode::HandleCollective(ConnId conn, Frame&& frame) {
  auto key = std::make_pair(frame.meta.rank_id(), frame.meta.tag());
  auto w = waiting_.find(key);
  BufferPtr payload = frame.payload ? frame.payload : Buffer::Allocate(0);
  if (w != waiting_.end()) {
    w->second->set_value(payload);
    waiting_.erase(w);
  } else if (!arrived_.emplace(key, payload).second) {
    messenger().Reply(conn, frame.meta, Status(Code::kAlreadyExists, "collective tag '" + key.second +
                                                                        "' from rank " + std::to_string(key.first) +
                                                                        " already delivered and not received"))
        .IgnoreError();
    return;
  }
  messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError();
}

void ServerNode::OnClusterEvent(const pb::ClusterEventMessage& ev) {
  if (ev.role() != pb::SERVER || ev.rank_id() < 0) return;
  const int rank = ev.rank_id();
  switch (ev.kind()) {
    case pb::ClusterEventMessage::NODE_TIMED_OUT: {
      Status why(Code::kUnavailable, "server rank " + std::to_string(rank) + " (" + ev.node_id() +
                                         ") timed out: nothing more will come from it");
      gone_ranks_[rank] = why;
      FailReceives(rank, /*and_above=*/false, why);
      break;
    }
    case pb::ClusterEventMessage::NODE_RECOVERED:
    case pb::ClusterEventMessage::NODE_RESTARTED:
      gone_ranks_.erase(rank);
      break;
    default:
      break;
  }
}

void ServerNode::FailReceives(int rank, bool and_above, const Status& why) {
  for (auto it = waiting_.lower_bound({rank, std::string()}); it != waiting_.end();) {
    if (!and_above && it->first.first != rank) break;
    it->second->set_value(why);
    it = waiting_.erase(it);
  }
}

std::future<Status> ServerNode::CollectiveSend(int rank, const std::string& tag, BufferPtr payload) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto fut = promise->get_future();
  bool queued = loop()->Run([this, rank, tag, payload, promise] {
    WithServerConn(rank, [this, tag, payload, promise](Result<ConnId> c) {
      if (!c.ok()) return promise->set_value(c.status());
      pb::MessageMeta meta = MakeMeta(pb::COLLECTIVE_SEND_DATA, pb::SERVER, Node::rank());
      meta.set_tag(tag);
      messenger().Call(*c, meta, payload, options_.request_timeout,
                       [promise](Result<Frame> r) { promise->set_value(r.status()); });
    });
  });
  if (!queued) promise->set_value(Stopped());
  return fut;
}

std::future<Result<BufferPtr>> ServerNode::CollectiveRecv(int rank, const std::string& tag) {
  auto promise = std::make_shared<std::promise<Result<BufferPtr>>>();
  auto fut = promise->get_future();
  bool queued = loop()->Run([this, rank, tag, promise] {
    auto key = std::make_pair(rank, tag);
    auto a = arrived_.find(key);
    if (a != arrived_.end()) {
      promise->set_value(a->second);
      arrived_.erase(a);
      return;
    }
    if (waiting_.count(key)) {
      promise->set_value(Status(Code::kAlreadyExists, "a receive of tag '" + tag + "' from rank " +
                                                          std::to_string(rank) + " is already waiting"));
      return;
    }
    if (closed()) return promise->set_value(Stopped());  // a shared loop runs on after Stop
    auto gone = gone_ranks_.find(rank);
    if (gone != gone_ranks_.end()) return promise->set_value(gone->second);
    waiting_[key] = promise;
  });
  if (!queued) promise->set_value(Stopped());
  return fut;
}

Status ServerNode::AllReduce(const std::string& tag, std::vector<float>* data, Duration timeout) {
  int me = rank();
  int n = metadata().server_num();
  if (n <= 1) return Status::Ok();
  // One deadline for the whole call, however many ranks are slow.
  const TimePoint deadline = std::chrono::steady_clock::now() + timeout;
  BufferPtr mine = Buffer::Copy(data->data(), data->size() * sizeof(float));
  std::vector<std::future<Status>> sends;
  for (int r = 0; r < n; ++r) {
    if (r != me) sends.push_back(CollectiveSend(r, tag, mine));
  }
  // Sum in rank order so every server computes bit-identical results.
  std::vector<float> sum(data->size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* part = data->data();
    BufferPtr got;
    if (r != me) {
      auto fut = CollectiveRecv(r, tag);
      if (fut.wait_until(deadline) != std::future_status::ready) {
        // The receive would wait on for a tag nobody receives again: withdrawn.
        loop()->Run([this, key = std::make_pair(r, tag)] { waiting_.erase(key); });
        return Status(Code::kTimeout, "allreduce '" + tag + "': nothing from server rank " + std::to_string(r) +
                                          " within " + std::to_string(ToMillis(timeout)) + " ms");
      }
      Result<BufferPtr> res = fut.get();
      if (!res.ok()) return res.status();
      got = *res;
      if (got->size() != data->size() * sizeof(float)) {
        return Status(Code::kInvalidArgument, "allreduce '" + tag + "': rank " + std::to_string(r) + " sent " +
                                                  std::to_string(got->size()) + " bytes, expected " +
                                                  std::to_string(data->size() * sizeof(float)));
      }
      part = reinterpret_cast<const float*>(got->data());
    }
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  for (auto& f : sends) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      return Status(Code::kTimeout, "allreduce '" + tag + "': a send was not answered within " +
                                        std::to_string(ToMillis(timeout)) + " ms");
    }
    PSCORE_RETURN_IF_ERROR(f.get());
  }
  *data = std::move(sum);
  return Status::Ok();
}

}  // namespace pscore::node
