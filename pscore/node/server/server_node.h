// ServerNode: a parameter server. Serves SEND_DATA requests from workers through
// handlers registered by user_cmd or by name, hosts the built-in parameter store
// (Push/Pull), and exchanges COLLECTIVE_SEND_DATA with other servers by rank and tag.
// Handlers run on the executor (options.handler_threads > 0) or the loop thread, and
// answer through a Responder that may be completed from any thread.
//
// The node wires services that do not know it: PeerAdmission (which links are members),
// ParamService (the built-in store, its pushes and pulls, the journal), KeyOwnership
// (which keys this server serves), KeyMigration (moving keys when the cluster scales),
// ReplicaResync (rebuilding a replica) and CollectiveMailbox. They reach other servers
// through ServerLinks, which this node implements. The node itself keeps the handler
// table and the per-link executor bookkeeping (loop thread).
#pragma once

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pscore/core/param_store.h"
#include "pscore/core/push_dedup.h"
#include "pscore/node/common/executor.h"
#include "pscore/node/common/node.h"
#include "pscore/node/server/collective_mailbox.h"
#include "pscore/node/server/data_handler.h"
#include "pscore/node/server/key_migration.h"
#include "pscore/node/server/key_ownership.h"
#include "pscore/node/server/param_service.h"
#include "pscore/node/server/peer_admission.h"
#include "pscore/node/server/replica_resync.h"
#include "pscore/node/server/server_links.h"

namespace pscore::node {

class ServerNode : public Node, private ServerLinks {
 public:
  ServerNode(NodeOptions options, core::ParamStore::Options store = {}, comm::EventLoop* loop = nullptr);
  ~ServerNode() override;

  // Register before Start. Names starting with "pscore." are reserved.
  void RegisterHandler(int user_cmd, DataHandler handler);
  void RegisterHandler(const std::string& name, DataHandler handler);
  core::ParamStore& store() { return params_.store(); }
  // Built-in pushes folded into the store while their values arrived (any thread).
  uint64_t streamed_pushes() const { return params_.streamed_pushes(); }
  // Whether a journal compaction is being written or waits to be ended (tests).
  bool journal_compacting() { return params_.journal_compacting(); }
  // Which pushes with an id were applied (pscore/core/push_dedup.h), and how many pushes came
  // again after they were applied and were acknowledged without being applied (any thread).
  const core::PushDedup& push_window() const { return params_.dedup(); }
  uint64_t repeated_pushes() const { return params_.repeated_pushes(); }
  // Changes refused because the journal (data_dir) could not write them (any thread).
  uint64_t journal_errors() const { return params_.journal_errors(); }
  // Requests of workers forwarded to the server they were for (MessageMeta.relay_rank),
  // and those of them that could not be (any thread).
  uint64_t relayed_requests() const { return relayed_.load(std::memory_order_relaxed); }
  uint64_t relay_failures() const { return relay_failures_.load(std::memory_order_relaxed); }
  void AppendRoleMetrics(MetricsText* m) const override;

  // Server-to-server messages matched by (sender rank, tag), whatever the arrival order.
  std::future<Status> CollectiveSend(int rank, const std::string& tag, BufferPtr payload);
  std::future<Result<BufferPtr>> CollectiveRecv(int rank, const std::string& tag);
  // Element-wise sum of `data` over all servers (same length everywhere); `tag` names
  // the round and must be unique per call. Blocking; not on the loop thread.
  Status AllReduce(const std::string& tag, std::vector<float>* data, Duration timeout);

 protected:
  Status StartRole() override;
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override;
  void StopRole() override;
  void OnStopCalled() override;  // from a handler: its executor thread is not waited for
  void OnPeerClosed(comm::ConnId conn, const Status& why) override;
  std::shared_ptr<comm::TailStream> OnRequestStream(comm::ConnId conn, const pb::MessageMeta& meta,
                                                    uint64_t tail) override;
  void OnMetadataApplied() override;
  void OnStateApplied(pb::ClusterState state) override;
  void OnClusterEvent(const pb::ClusterEventMessage& ev) override;
  void OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) override;
  void OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) override;

 private:
  void CallServer(int rank, pb::MessageMeta meta, BufferPtr payload,
                  std::function<void(Result<comm::Frame>)> done) override;
  void RegisterBuiltins();
  void Dispatch(comm::ConnId conn, comm::Frame&& frame);
  // A worker's built-in push or pull for another server (relay_rank), which that worker
  // cannot reach: forwarded there on this server's link, in arrival order, and answered
  // with that server's answer (loop thread).
  void Relay(comm::ConnId conn, comm::Frame&& frame);
  // Runs a handler: at once on the loop thread (no executor, or a small built-in request
  // on a link with nothing at the executor), else on the executor in the link's order.
  void RunHandler(comm::ConnId conn, const pb::MessageMeta& meta, const DataHandler& handler, DataRequest req);
  Responder MakeResponder(comm::ConnId conn, const pb::MessageMeta& meta);
  // Hands the member ids of the metadata just applied to admission (loop thread).
  void RefreshMemberIds();
  // Outside a scale operation, serve the key range of the current metadata (loop thread).
  void RefreshView();
  // Loop thread: the journal refused a change (a full disk). With every key range this
  // server holds served by another live replica, it steps down (exits its part in the job)
  // so that they serve the ranges; otherwise it refuses on and the workers send again.
  void OnJournalError(const Status& why);
  // The view the metadata gives; *self_resyncing: it marks this server resyncing.
  KeyView ViewOf(const pb::SendMetadataMessage& md, bool* self_resyncing) const;
  // Tells the scheduler this server's resync is done (loop thread).
  void ReportResynced(std::function<void(const Status&)> answered);

  comm::AliveToken alive_;  // expires as the node is destroyed: queued answers and closures check it
  bool stepped_down_ = false;  // loop thread: OnJournalError ended this member
  std::unique_ptr<Executor> executor_;
  KeyOwnership ownership_;
  ParamService params_;
  ReplicaResync resync_;
  KeyMigration migration_;
  PeerAdmission admission_;
  CollectiveMailbox mailbox_;
  // Per link: closures submitted to the executor and not yet finished (the map is loop
  // state; the count is decremented by the executor thread when a closure ends). A small
  // built-in request on a link with none runs at once on the loop thread: ordering per
  // link is kept, and two thread hand-offs are saved.
  std::unordered_map<comm::ConnId, std::shared_ptr<std::atomic<int>>> in_executor_;
  std::unordered_map<int, DataHandler> by_cmd_;
  std::unordered_map<std::string, DataHandler> by_name_;
  std::atomic<uint64_t> relayed_{0};         // Relay: requests forwarded
  std::atomic<uint64_t> relay_failures_{0};  // Relay: of those, answered with an error
};

}  // namespace pscore::node
