#include "pscore/core/param_journal.h"

#include <cstring>

#include "pscore/core/buffer.h"
#include "pscore/core/endian.h"
#include "pscore/core/kv_codec.h"
#include "pscore/core/state_file.h"

namespace pscore::core {
namespace {

// The checksum covers the op byte and the body, so a flipped op is caught too.
uint32_t RecordCrc(uint8_t op, std::string_view body) {
  return Crc32(body.data(), body.size(), Crc32(&op, 1));
}

bool KnownOp(uint8_t op) { return op >= 1 && op <= 7; }

constexpr size_t kPushIdFixedBytes = 2 + 8 + 8;  // writer_len, incarnation, seq

std::string PushIdPrefix(const PushId& id) {
  std::string out(kPushIdFixedBytes + id.writer.size(), '\0');
  PutLe(id.writer.size(), 2, &out[0]);
  out.replace(2, id.writer.size(), id.writer);
  PutLe(id.incarnation, 8, &out[2 + id.writer.size()]);
  PutLe(id.seq, 8, &out[10 + id.writer.size()]);
  return out;
}

// The id at the front of a kPushId body; *kv gets the rest.
Result<PushId> DecodePushIdPrefix(std::string_view body, std::string_view* kv) {
  if (body.size() < 2) return Status(Code::kInvalidArgument, "push-id body of " + std::to_string(body.size()) + " bytes");
  const size_t len = GetLe(body.data(), 2);
  if (len > PushDedup::kMaxWriterBytes || body.size() < kPushIdFixedBytes + len) {
    return Status(Code::kInvalidArgument, "push-id body of " + std::to_string(body.size()) +
                                              " bytes with a writer of " + std::to_string(len));
  }
  PushId id;
  id.writer.assign(body.data() + 2, len);
  id.incarnation = GetLe(body.data() + 2 + len, 8);
  id.seq = GetLe(body.data() + 10 + len, 8);
  *kv = body.substr(kPushIdFixedBytes + len);
  return id;
}

std::string RecordHeader(JournalOp op, uint64_t body_len, uint32_t crc) {
  std::string out(kJournalRecordHeaderBytes, '\0');
  out[0] = static_cast<char>(op);
  PutLe(body_len, 4, &out[1]);
  PutLe(crc, 4, &out[5]);
  return out;
}

}  // namespace

std::string JournalFileHeader() {
  std::string out(kJournalFileHeaderBytes, '\0');
  PutLe(kJournalMagic, 4, &out[0]);
  PutLe(kJournalVersion, 4, &out[4]);
  return out;
}

std::string JournalRecordHeader(JournalOp op, std::string_view body) {
  return RecordHeader(op, body.size(), RecordCrc(static_cast<uint8_t>(op), body));
}

std::string JournalRecordHeader(JournalOp op, const Payload& body) {
  const uint8_t op_byte = static_cast<uint8_t>(op);
  uint32_t crc = Crc32(&op_byte, 1);
  if (body.head) crc = Crc32(body.head->data(), body.head->size(), crc);
  for (const Slice& s : body.tail) crc = Crc32(s.data, s.size, crc);
  return RecordHeader(op, body.size(), crc);
}

std::string EncodeJournalCovers(uint64_t segment) {
  std::string out(8, '\0');
  PutLe(segment, 8, &out[0]);
  return out;
}

Result<uint64_t> DecodeJournalCovers(std::string_view body) {
  if (body.size() != 8) {
    return Status(Code::kInvalidArgument, "covers record of " + std::to_string(body.size()) + " bytes");
  }
  return GetLe(body.data(), 8);
}

std::string JournalPushIdHead(const PushId& id, std::string_view kv) {
  const std::string prefix = PushIdPrefix(id);
  const uint8_t op = static_cast<uint8_t>(JournalOp::kPushId);
  const uint32_t crc = Crc32(kv.data(), kv.size(), Crc32(prefix.data(), prefix.size(), Crc32(&op, 1)));
  return RecordHeader(JournalOp::kPushId, prefix.size() + kv.size(), crc) + prefix;
}

std::string EncodeJournalDrop(int rank, int num_servers) {
  std::string out(8, '\0');
  PutLe(static_cast<uint32_t>(rank), 4, &out[0]);
  PutLe(static_cast<uint32_t>(num_servers), 4, &out[4]);
  return out;
}

std::string EncodeJournalDropKeys(const std::vector<uint64_t>& keys) {
  std::string out(8 * keys.size(), '\0');
  for (size_t i = 0; i < keys.size(); ++i) PutLe(keys[i], 8, &out[8 * i]);
  return out;
}

Result<ParsedJournal> ParseJournal(std::string_view bytes) {
  if (bytes.size() < kJournalFileHeaderBytes) {
    return Status(Code::kInvalidArgument, "journal shorter than its header (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (GetLe(bytes.data(), 4) != kJournalMagic) return Status(Code::kInvalidArgument, "not a journal (bad magic)");
  const uint64_t version = GetLe(bytes.data() + 4, 4);
  if (version != kJournalVersion) {
    return Status(Code::kInvalidArgument, "journal format version " + std::to_string(version) +
                                              " (this build reads " + std::to_string(kJournalVersion) + ")");
  }
  ParsedJournal out;
  size_t at = kJournalFileHeaderBytes;
  while (at < bytes.size()) {
    if (bytes.size() - at < kJournalRecordHeaderBytes) break;  // torn header
    const uint8_t op = static_cast<uint8_t>(bytes[at]);
    const uint64_t len = GetLe(bytes.data() + at + 1, 4);
    const uint32_t crc = static_cast<uint32_t>(GetLe(bytes.data() + at + 5, 4));
    if (!KnownOp(op) || len > kMaxJournalBodyBytes) {
      return Status(Code::kInvalidArgument, "damaged journal record at offset " + std::to_string(at) +
                                                " (op " + std::to_string(op) + ", length " + std::to_string(len) + ")");
    }
    if (bytes.size() - at - kJournalRecordHeaderBytes < len) break;  // torn body
    std::string_view body = bytes.substr(at + kJournalRecordHeaderBytes, len);
    if (RecordCrc(op, body) != crc) {
      return Status(Code::kInvalidArgument, "journal record at offset " + std::to_string(at) + " fails its checksum");
    }
    out.records.push_back(JournalRecord{static_cast<JournalOp>(op), body});
    at += kJournalRecordHeaderBytes + len;
  }
  out.valid_bytes = at;
  return out;
}

Status ReplayJournal(const std::vector<JournalRecord>& records, ParamStore* store, PushDedup* dedup) {
  for (size_t i = 0; i < records.size(); ++i) {
    const JournalRecord& r = records[i];
    if (r.op == JournalOp::kDedup) {
      if (dedup == nullptr) continue;
      Status st = dedup->Decode(r.body);
      if (!st.ok()) return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": " + st.message());
      continue;
    }
    std::string_view kv = r.body;
    if (r.op == JournalOp::kPushId) {
      Result<PushId> id = DecodePushIdPrefix(r.body, &kv);
      if (!id.ok()) {
        return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": " + id.status().message());
      }
      if (dedup != nullptr) dedup->MarkApplied(*id);
    }
    if (r.op == JournalOp::kDrop) {
      if (r.body.size() != 8) {
        return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": drop body of " +
                                                  std::to_string(r.body.size()) + " bytes");
      }
      const int rank = static_cast<int32_t>(GetLe(r.body.data(), 4));
      const int n = static_cast<int32_t>(GetLe(r.body.data() + 4, 4));
      store->ExtractNotOwned(rank, n, /*erase=*/true);
      continue;
    }
    if (r.op == JournalOp::kCovers) {
      Result<uint64_t> segment = DecodeJournalCovers(r.body);
      if (!segment.ok()) {
        return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": " + segment.status().message());
      }
      continue;
    }
    if (r.op == JournalOp::kDropKeys) {
      if (r.body.size() % 8 != 0) {
        return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": key-drop body of " +
                                                  std::to_string(r.body.size()) + " bytes");
      }
      for (size_t at = 0; at < r.body.size(); at += 8) {
        const uint64_t key = GetLe(r.body.data() + at, 8);
        store->Erase(&key, 1);
      }
      continue;
    }
    BufferPtr aligned = Buffer::Copy(kv.data(), kv.size());  // the decoder wants 8-byte alignment
    Result<KvView> view = DecodeKvPairs(aligned->data(), aligned->size(), /*expect_values=*/true);
    if (!view.ok()) {
      return Status(Code::kInvalidArgument, "journal record " + std::to_string(i) + ": " + view.status().message());
    }
    if (r.op == JournalOp::kPush || r.op == JournalOp::kPushId) {
      store->Push(view->keys, view->Lengths(), view->values, view->num_keys).IgnoreError();  // as when served
      continue;
    }
    store->Insert(view->keys, view->Lengths(), view->values, view->num_keys);
  }
  return Status::Ok();
}

}  // namespace pscore::core
