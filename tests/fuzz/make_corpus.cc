// Writes the seed corpus of every fuzz target: small valid inputs, one file each, under
// <dir>/<target>/ (tests/fuzz/corpus/ is checked in; regenerate with
// `build-fuzz/make_corpus tests/fuzz/corpus`). Deterministic: the same bytes every run.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/state_file.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/server/server_node.h"
#include "fuzz/dispatch_input.h"

namespace {

using pscore::fuzz::EncodeRecord;
using pscore::fuzz::kFromScheduler;
using pscore::node::MakeMeta;
namespace pb = pscore::pb;

std::string g_root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::string dir = g_root + "/" + target;
  mkdir(g_root.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(name.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

std::string Str(const pscore::BufferPtr& b) { return b ? std::string(b->view()) : std::string(); }
std::string Ser(const google::protobuf::MessageLite& m) { return m.SerializeAsString(); }

std::string Frame(const pb::MessageMeta& meta, const std::string& payload) {
  pscore::comm::FrameHeader h;
  std::string m = meta.SerializeAsString();
  h.meta_len = static_cast<uint32_t>(m.size());
  h.data_len = payload.size();
  return pscore::comm::EncodeHeader(h) + m + payload;
}

pb::MessageMeta Req(pb::NodeCommand cmd, pb::NodeRole role, int rank, uint64_t id) {
  pb::MessageMeta m = MakeMeta(cmd, role, rank);
  m.set_request_id(id);
  return m;
}

std::string PushPayload() {
  const uint64_t keys[] = {1, 2, 42};
  const uint32_t lens[] = {2, 1, 3};
  const float values[] = {1, 2, 3, 4, 5, 6};
  return Str(pscore::core::EncodeKvPairs(keys, 3, lens, values, 6));
}

std::string PullPayload() {
  const uint64_t keys[] = {1, 42};
  return Str(pscore::core::EncodeKvPairs(keys, 2, nullptr, nullptr, 0));
}

void FrameDecoderSeeds() {
  // [chunk count][chunk sizes u16][stream]
  std::string stream = Frame(Req(pb::SEND_DATA, pb::WORKER, 0, 1), "hello") +
                       Frame(Req(pb::PING, pb::WORKER, 0, 2), "") + Frame(pb::MessageMeta(), "");
  Write("frame_decoder_fuzz", "three_frames_whole", std::string(1, '\0') + stream);
  Write("frame_decoder_fuzz", "three_frames_split", std::string("\x03\x01\x00\x07\x00\x10\x00", 7) + stream);
  pb::MessageMeta named = Req(pb::SEND_DATA, pb::WORKER, 0, 3);
  named.set_handler("pscore.push");
  Write("frame_decoder_fuzz", "push_frame", std::string("\x01\x05\x00", 3) + Frame(named, PushPayload()));
  // Answers whose meta names a payload head (the rest may go to a sink): request 1 gets a
  // sink, 2 a sink with a 20,000-byte tail (read straight into it), 3 none.
  std::string answers;
  for (uint64_t id : {1, 2, 3}) {
    pb::MessageMeta m = Req(pb::SEND_DATA, pb::SERVER, 0, id);
    m.set_is_response(true);
    m.set_payload_head(8);
    answers += Frame(m, std::string(8, 'h') + std::string(id == 2 ? 20000 : 100, static_cast<char>('a' + id)));
  }
  Write("frame_decoder_fuzz", "split_answers", std::string("\x02\x00\x10\x40\x00", 5) + answers);
  // Requests with a payload head: sinks declined (ids 3, 6, 9), then a stream taken (6)
  // or declined (3, 9), behind a plain frame that must be delivered first.
  std::string requests = Frame(Req(pb::SEND_DATA, pb::WORKER, 0, 1), "plain");
  for (uint64_t id : {3, 6, 9}) {
    pb::MessageMeta m = Req(pb::SEND_DATA, pb::WORKER, 0, id);
    m.set_payload_head(16);
    requests += Frame(m, std::string(16, 'h') + std::string(id == 6 ? 20003 : 400, static_cast<char>('a' + id)));
  }
  Write("frame_decoder_fuzz", "stream_requests", std::string("\x02\x00\x10\x40\x00", 5) + requests);
}

// Frames as a padding sender writes them from the start of a connection: each meta
// carries the pad field that puts its payload 8-byte aligned in the stream.
std::string PaddedStream(const std::vector<std::pair<pb::MessageMeta, std::string>>& frames) {
  std::string out;
  for (const auto& [meta, payload] : frames) {
    std::string m = meta.SerializeAsString();
    const size_t pad = pscore::comm::MetaPadBytes(out.size(), m.size());
    std::string pad_bytes(pad, '\0');
    if (pad != 0) pscore::comm::StoreMetaPad(pad, pad_bytes.data());
    m += pad_bytes;
    pscore::comm::FrameHeader h;
    h.meta_len = static_cast<uint32_t>(m.size());
    h.data_len = payload.size();
    out += pscore::comm::EncodeHeader(h) + m + payload;
  }
  return out;
}

pb::MessageMeta Answer(uint64_t id) {
  pb::MessageMeta m = Req(pb::SEND_DATA, pb::SERVER, 0, id);
  m.set_is_response(true);
  return m;
}

// The peer's side of PullSync's direct link: answers to the link's requests 1, 2, 3, ...
void BlockingLinkSeeds() {
  const std::string t = "blocking_link_fuzz";
  // Small aligned answers (handed out in place), one of 20,000 bytes (read straight into
  // its frame), and a stray request and a stale answer the link reads past.
  pb::MessageMeta error = Answer(4);
  error.set_status_code(5);
  error.set_error("no such key");
  Write(t, "padded_answers", PaddedStream({{Answer(1), PushPayload()},
                                           {Req(pb::SEND_DATA, pb::SERVER, 0, 9), "stray"},
                                           {Answer(1), "stale"},
                                           {Answer(2), std::string(4096, 'b')},
                                           {Answer(3), std::string(20000, 'c')},
                                           {error, ""},
                                           {Answer(5), std::string(24, 'e')}}));
  // A sender that does not pad: misaligned answers are copied out.
  Write(t, "unpadded_answers", Frame(Answer(1), "abc") + Frame(Answer(2), std::string(100, 'x')) +
                                   Frame(Answer(3), std::string(17000, 'y')));
}

void KvSeeds() {
  Write("kv_codec_fuzz", "push", PushPayload());
  const uint64_t keys[] = {3, 17, 1ull << 33};
  const float values[] = {1, 2, 3, 4, 5, 6};
  Write("kv_codec_fuzz", "push_rows", Str(pscore::core::EncodeKvPairsRows(keys, 3, 2, values)));  // row_len
  Write("kv_codec_fuzz", "pull", PullPayload());
  Write("kv_codec_fuzz", "empty", Str(pscore::core::EncodeKvPairs(nullptr, 0, nullptr, nullptr, 0)));
}

std::string RegisterRec(uint8_t conn, const std::string& id, pb::NodeRole role, uint64_t rid) {
  pb::RegisterMessage r;
  r.set_ip("127.0.0.1");
  r.set_port(role == pb::SERVER ? 7000 : 0);
  r.set_node_id(id);
  r.set_role(role);
  r.set_incarnation(11 + rid);
  r.set_protocol_version(pscore::node::kProtocolVersion);
  r.set_requested_rank(-1);
  return EncodeRecord(conn, Req(pb::REGISTER, role, -1, rid), Ser(r));
}

void SchedulerSeeds() {
  const std::string t = "scheduler_dispatch_fuzz";
  std::string reg = RegisterRec(0, "worker-a", pb::WORKER, 1) + RegisterRec(1, "server-a", pb::SERVER, 2);
  Write(t, "register_two", reg);
  pb::HeartbeatMessage hb;
  hb.set_node_id("worker-a");
  hb.set_node_state(pb::NODE_READY);
  std::string beat = EncodeRecord(0, Req(pb::HEARTBEAT, pb::WORKER, 0, 3), Ser(hb)) +
                     EncodeRecord(0, Req(pb::FETCH_METADATA, pb::WORKER, 0, 4), "");
  Write(t, "register_heartbeat_fetch", reg + beat);
  pb::KvRequest set;
  set.set_op(pb::KvRequest::SET);
  set.set_key("job/a");
  set.set_value("1");
  set.set_overwrite(true);
  pb::KvRequest get;
  get.set_op(pb::KvRequest::GET);
  get.set_key("job/a");
  get.set_timeout_ms(100);
  pb::KvRequest list;
  list.set_op(pb::KvRequest::LIST);
  list.set_key("job/");
  Write(t, "kv", reg + EncodeRecord(0, Req(pb::KV_REQUEST, pb::WORKER, 0, 5), Ser(set)) +
                     EncodeRecord(1, Req(pb::KV_REQUEST, pb::SERVER, 0, 6), Ser(get)) +
                     EncodeRecord(1, Req(pb::KV_REQUEST, pb::SERVER, 0, 7), Ser(list)));
  pb::BarrierRequest b;
  b.set_id("epoch-1");
  b.set_timeout_ms(100);
  b.set_node_id("worker-a");
  pb::BarrierRequest b2 = b;
  b2.set_node_id("server-a");
  Write(t, "barrier", reg + EncodeRecord(0, Req(pb::BARRIER, pb::WORKER, 0, 8), Ser(b)) +
                          EncodeRecord(1, Req(pb::BARRIER, pb::SERVER, 0, 9), Ser(b2)));
  pb::FinishMessage fin;
  fin.set_node_id("worker-a");
  fin.set_timeout_ms(100);
  pb::FinishMessage fin2 = fin;
  fin2.set_node_id("server-a");
  Write(t, "finish", reg + EncodeRecord(0, Req(pb::FINISH, pb::WORKER, 0, 10), Ser(fin)) +
                         EncodeRecord(1, Req(pb::FINISH, pb::SERVER, 0, 11), Ser(fin2)));
  pb::AdminRequest status;
  status.set_op("status");
  pb::AdminRequest out;
  out.set_op("scale_out");
  out.set_worker_num(2);
  out.set_server_num(2);
  pb::AdminRequest in;
  in.set_op("scale_in");
  in.add_node_ids("server-a");
  Write(t, "admin", reg + EncodeRecord(2, Req(pb::ADMIN, pb::ADMIN_CLIENT, -1, 12), Ser(status)) +
                        EncodeRecord(2, Req(pb::ADMIN, pb::ADMIN_CLIENT, -1, 13), Ser(out)) +
                        RegisterRec(3, "worker-b", pb::WORKER, 14) +
                        EncodeRecord(2, Req(pb::ADMIN, pb::ADMIN_CLIENT, -1, 15), Ser(in)));
  pb::EventMessage ev;
  ev.set_event(3);
  ev.set_node_id("worker-a");
  ev.set_payload("x");
  pb::ErrorReport err;
  pb::ScaleOutDoneMessage done;
  done.set_node_id("server-a");
  done.set_epoch(2);
  Write(t, "event_error_done_ping", reg + EncodeRecord(0, Req(pb::SEND_EVENT, pb::WORKER, 0, 16), Ser(ev)) +
                                         EncodeRecord(1, Req(pb::REPORT_ERROR, pb::SERVER, 0, 17), Ser(err)) +
                                         EncodeRecord(1, Req(pb::SCALE_OUT_DONE, pb::SERVER, 0, 18), Ser(done)) +
                                         EncodeRecord(2, Req(pb::PING, pb::ADMIN_CLIENT, -1, 19), "") +
                                         EncodeRecord(2, Req(pb::SEND_DATA, pb::WORKER, 0, 20), "junk"));
}

pb::SendMetadataMessage TwoServers(uint64_t epoch, pb::ClusterState state) {
  pb::SendMetadataMessage md;
  md.set_worker_num(1);
  md.set_server_num(2);
  md.set_cluster_state(state);
  md.set_rank_id(0);
  md.set_epoch(epoch);
  for (int r = 0; r < 2; ++r) {
    pb::ServersMeta* s = md.add_servers_meta();
    s->set_rank_id(r);
    s->set_role(pb::SERVER);
    s->set_node_id("server-" + std::to_string(r));
    s->set_ip("127.0.0.1");
    s->set_port(1);
    s->set_is_alive(true);
  }
  return md;
}

std::string SchedRec(pb::NodeCommand cmd, const google::protobuf::MessageLite& m) {
  pb::MessageMeta meta = MakeMeta(cmd, pb::SCHEDULER, 0);
  meta.set_oneway(true);
  return EncodeRecord(kFromScheduler, meta, Ser(m));
}

std::string ClusterEvent(pb::ClusterEventMessage::Kind kind, pb::ClusterState state) {
  pb::ClusterEventMessage ev;
  ev.set_kind(kind);
  ev.set_cluster_state(state);
  ev.set_node_id("server-1");
  ev.set_epoch(2);
  return SchedRec(pb::CLUSTER_EVENT, ev);
}

std::string SchedulerPushes() {
  pb::ScaleOutMessage so;
  so.set_worker_num(1);
  so.set_server_num(2);
  so.set_epoch(2);
  pb::EventRespMessage ue;
  ue.set_event(9);
  ue.set_node_id("worker-0");
  ue.set_payload("p");
  return SchedRec(pb::SCALE_OUT, so) + SchedRec(pb::SEND_METADATA, TwoServers(2, pb::CLUSTER_SCALE_OUT)) +
         ClusterEvent(pb::ClusterEventMessage::STATE_CHANGED, pb::CLUSTER_READY) +
         ClusterEvent(pb::ClusterEventMessage::NODE_TIMED_OUT, pb::NODE_TIMEOUT) + SchedRec(pb::SEND_EVENT, ue);
}

std::string ScaleIn() {
  pb::ScaleInMessage si;
  si.set_worker_num(1);
  si.set_server_num(1);
  si.set_is_node_scale_in(true);
  si.set_epoch(3);
  si.add_leaving_node_ids("server-fuzz");
  return SchedRec(pb::SCALE_IN, si);
}

void NodeSeeds() {
  const std::string s = "server_dispatch_fuzz";
  pb::MessageMeta push = Req(pb::SEND_DATA, pb::WORKER, 0, 1);
  push.set_handler(pscore::node::kPushHandler);
  pb::MessageMeta pull = Req(pb::SEND_DATA, pb::WORKER, 0, 2);
  pull.set_handler(pscore::node::kPullHandler);
  Write(s, "push_pull", EncodeRecord(0, push, PushPayload()) + EncodeRecord(0, pull, PullPayload()));
  pb::MessageMeta echo = Req(pb::SEND_DATA, pb::WORKER, 0, 3);
  echo.set_user_cmd(1);
  pb::MessageMeta silent = Req(pb::SEND_DATA, pb::WORKER, 0, 4);
  silent.set_user_cmd(2);
  pb::MessageMeta coll = Req(pb::COLLECTIVE_SEND_DATA, pb::SERVER, 1, 5);
  coll.set_tag("allreduce-1");
  Write(s, "user_cmds_collective", EncodeRecord(1, echo, "abc") + EncodeRecord(1, silent, "") +
                                       EncodeRecord(2, coll, "\0\0\x80?") +
                                       EncodeRecord(2, Req(pb::PING, pb::SERVER, 1, 6), ""));
  pb::MessageMeta migrate = Req(pb::SEND_DATA, pb::SERVER, 1, 7);
  migrate.set_handler(pscore::node::kMigrateHandler);
  Write(s, "scale_out_push", EncodeRecord(0, push, PushPayload()) + SchedulerPushes() +
                                 EncodeRecord(0, pull, PullPayload()) + EncodeRecord(3, migrate, PushPayload()));
  Write(s, "scale_in", EncodeRecord(0, push, PushPayload()) + ScaleIn() +
                           SchedRec(pb::TERMINATE, pb::FinishMessage()));
  const std::string w = "worker_dispatch_fuzz";
  Write(w, "scheduler_pushes", SchedulerPushes());
  Write(w, "scale_in_terminate", ScaleIn() + SchedRec(pb::TERMINATE, pb::FinishMessage()));
  Write(w, "peer_request", EncodeRecord(0, push, PushPayload()));
}

void HttpSeeds() {
  const std::string t = "http_request_fuzz";
  Write(t, "get", "GET /api/v1/ranktable?format=json&x=%41 HTTP/1.1\r\nHost: a\r\n\r\n");
  Write(t, "post_body", "POST /api/v1/admin/scale_out?workers=2 HTTP/1.1\r\nHost: a\r\n"
                        "Authorization: Bearer t\r\nContent-Length: 5\r\n\r\nhello");
  Write(t, "pipelined", "GET /a HTTP/1.1\r\n\r\nGET /b?k=v HTTP/1.1\r\nConnection: close\r\n\r\n");
  Write(t, "chunked_body", "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  Write(t, "stream", "GET /stream?chunk=zz HTTP/1.1\r\n\r\n");
  Write(t, "close", "GET /close HTTP/1.0\r\n\r\n");
}

void StateSeeds() {
  pb::PersistedState st;
  st.set_sequence(3);
  st.set_job_id("job");
  st.set_cluster_state(pb::CLUSTER_READY);
  st.set_epoch(4);
  st.set_worker_num(1);
  st.set_server_num(1);
  const char* ids[] = {"worker-a", "server-a"};
  for (int i = 0; i < 2; ++i) {
    pb::PersistedNode* n = st.add_nodes();
    n->set_node_id(ids[i]);
    n->set_role(i == 0 ? pb::WORKER : pb::SERVER);
    n->set_rank(0);
    n->set_ip("127.0.0.1");
    n->set_port(i == 0 ? 0 : 7000);
    n->set_incarnation(5 + i);
    n->set_in_metadata(true);
  }
  pb::KvEntry* kv = st.add_kv();
  kv->set_key("job/a");
  kv->set_value("1");
  const std::string t = "state_loader_fuzz";
  Write(t, "file", std::string(1, '\0') + pscore::core::SerializeState(st));
  Write(t, "body", std::string(1, '\1') + st.SerializeAsString());
  st.set_cluster_state(pb::CLUSTER_SCALE_OUT);
  st.mutable_scale()->set_old_worker_num(1);
  st.mutable_scale()->set_old_server_num(1);
  st.set_server_num(2);
  pb::PersistedNode* added = st.add_nodes();
  added->set_node_id("server-b");
  added->set_role(pb::SERVER);
  added->set_rank(1);
  st.mutable_scale()->add_added("server-b");
  Write(t, "body_scaling", std::string(1, '\1') + st.SerializeAsString());
  // Parameter journals (mode 2: a whole file; mode 3: records the harness frames).
  const uint64_t keys[2] = {3, 9};
  const uint32_t lens[2] = {2, 1};
  const float values[3] = {1.0f, 2.0f, 3.0f};
  pscore::BufferPtr push = pscore::core::EncodeKvPairs(keys, 2, lens, values, 3);
  std::string body(push->data(), push->size());
  body.resize((body.size() + 7) / 8 * 8, '\0');  // the framed mode takes bodies in 8-byte units
  std::string journal = pscore::core::JournalFileHeader();
  journal += pscore::core::JournalRecordHeader(pscore::core::JournalOp::kPush, body) + body;
  journal += pscore::core::JournalRecordHeader(pscore::core::JournalOp::kInsert, body) + body;
  const std::string drop = pscore::core::EncodeJournalDrop(0, 2);
  journal += pscore::core::JournalRecordHeader(pscore::core::JournalOp::kDrop, drop) + drop;
  const std::string drop_keys = pscore::core::EncodeJournalDropKeys({3});
  journal += pscore::core::JournalRecordHeader(pscore::core::JournalOp::kDropKeys, drop_keys) + drop_keys;
  Write(t, "journal_file", std::string(1, '\2') + journal);
  std::string records;
  records += std::string(1, '\0') + std::string(1, static_cast<char>(body.size() / 8)) + body;  // push
  records += std::string(1, '\1') + std::string(1, static_cast<char>(body.size() / 8)) + body;  // insert
  records += std::string(1, '\2') + std::string(1, '\1') + drop;                                // drop
  records += std::string(1, '\3') + std::string(1, '\1') + drop_keys;                           // drop keys
  Write(t, "journal_records", std::string(1, '\3') + records);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  FrameDecoderSeeds();
  BlockingLinkSeeds();
  KvSeeds();
  SchedulerSeeds();
  NodeSeeds();
  HttpSeeds();
  StateSeeds();
  return 0;
}
