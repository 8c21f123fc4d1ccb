// libFuzzer target: the scheduler's persisted-state loader (pscore/core/state_file.h) and what a
// restarted scheduler does with a state that loads (ClusterManager::Restore).
// Input: [mode u8][rest]. Mode even: `rest` is a whole state file, as read from disk
// (magic, version, length and CRC-32 must all hold, so this mostly exercises the framing
// checks). Mode odd: `rest` is the body; the harness frames it with a correct header and
// checksum, so the protobuf parse and the body validation get fuzzed too.
// A state that loads is restored into a fresh ClusterManager; the manager's own snapshot
// must then serialize and load again, and a tick, metadata and a register must not fail
// hard.
// Mode with bit 1 set: the server's parameter journal loader (pscore/core/param_journal.h)
// instead. Bit 0 clear: `rest` is a whole journal file. Bit 0 set: `rest` is a list of
// [op u8][len u8][len*8 bytes of body] that the harness frames as records with correct
// headers and checksums after a valid file header, so the replay gets fuzzed too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pscore/core/clock.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"
#include "pscore/core/state_file.h"

namespace {

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string Framed(std::string_view body) {
  std::string s;
  PutU32(&s, pscore::core::kStateMagic);
  PutU32(&s, pscore::core::kStateVersion);
  PutU64(&s, body.size());
  PutU32(&s, pscore::core::Crc32(body.data(), body.size()));
  s.append(body.data(), body.size());
  return s;
}

std::string FramedJournal(std::string_view rest) {
  std::string file = pscore::core::JournalFileHeader();
  while (rest.size() >= 2) {
    auto op = static_cast<pscore::core::JournalOp>(1 + static_cast<uint8_t>(rest[0]) % 5);  // kPush .. kCovers
    size_t len = std::min<size_t>(static_cast<uint8_t>(rest[1]) * 8u, rest.size() - 2);
    std::string_view body = rest.substr(2, len);
    file += pscore::core::JournalRecordHeader(op, body);
    file.append(body.data(), body.size());
    rest.remove_prefix(2 + len);
  }
  return file;
}

void FuzzJournal(uint8_t mode, std::string_view rest) {
  std::string file = (mode & 1) ? FramedJournal(rest) : std::string(rest);
  auto parsed = pscore::core::ParseJournal(file);
  if (!parsed.ok()) return;
  if (parsed->valid_bytes > file.size()) __builtin_trap();
  pscore::core::ParamStore store({pscore::core::UpdateRule::kSum, 0.1f});
  (void)pscore::core::ReplayJournal(parsed->records, &store);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 2) {
    FuzzJournal(data[0], rest);
    return 0;
  }
  std::string file = (data[0] & 1) ? Framed(rest) : std::string(rest);
  auto state = pscore::core::ParseState(file);
  if (!state.ok()) return 0;

  pscore::FakeClock clock;
  pscore::core::ClusterConfig config;
  config.worker_num = 2;
  config.server_num = 2;
  pscore::core::ClusterManager cluster(config, &clock);
  if (!cluster.Restore(*state).ok()) return 0;
  // What the restarted scheduler holds must persist and load again.
  auto again = pscore::core::ParseState(pscore::core::SerializeState(cluster.Snapshot()));
  if (!again.ok()) __builtin_trap();
  cluster.Tick();
  (void)cluster.BuildMetadata();
  pscore::core::RegisterRequest req;
  req.node_id = "fuzz-newcomer";
  req.role = pscore::pb::WORKER;
  req.ip = "127.0.0.1";
  req.port = 1;
  req.incarnation = 7;
  (void)cluster.Register(req);
  return 0;
}
