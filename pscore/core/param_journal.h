// Parameter journal codec: the ordered record of every change a server made to its
// ParamStore, so a server killed and restarted with the same data directory gets its
// parameters back (pscore/node/server/server_journal.h does the file I/O). Pure functions, any thread.
//
// File layout (little-endian):
//   | magic u32 "PSJL" | version u32 |                                   8 bytes, once
//   | op u8 | body_len u32 | crc32(op byte + body) u32 | body |           per record
// Bodies: kPush and kInsert carry a kv-pairs request (pscore/core/kv_codec.h) with values;
// kDrop carries | rank i32 | num_servers i32 |; kDropKeys carries | key u64 |*; kCovers
// carries | segment u64 | (a compacted file's first record: pscore/node/server/server_journal.h);
// kPushId carries | writer_len u16 | writer | incarnation u64 | seq u64 | then a kv-pairs
// request with values (a push with its id, pscore/core/push_dedup.h); kDedup carries a
// PushDedup snapshot (a compacted file's second record, when any push had an id).
//
// Records are appended whole, in the order the changes were applied, so only the last
// record can be torn (a process killed mid-append). A torn tail is cut off; a complete
// record with a wrong checksum, an unknown op or an undecodable body is damage, reported
// with its offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pscore/core/buffer.h"
#include "pscore/core/param_store.h"
#include "pscore/core/push_dedup.h"
#include "pscore/core/status.h"

namespace pscore::core {

inline constexpr uint32_t kJournalMagic = 0x4C4A5350;  // "PSJL" read as little-endian bytes
inline constexpr uint32_t kJournalVersion = 1;
inline constexpr size_t kJournalFileHeaderBytes = 8;
inline constexpr size_t kJournalRecordHeaderBytes = 9;
inline constexpr uint32_t kMaxJournalBodyBytes = 1u << 31;

enum class JournalOp : uint8_t {
  kPush = 1,    // ParamStore::Push of the body's keys, lens and values
  kInsert = 2,  // ParamStore::Insert of each of the body's entries (migration, compaction)
  kDrop = 3,    // ParamStore::ExtractNotOwned(rank, num_servers, erase = true)
  kDropKeys = 4,  // ParamStore::Erase of the body's keys
  kCovers = 5,    // no store change: the file holds the changes of segments up to the body's
  kPushId = 6,    // as kPush, and the push's id enters the dedup window
  kDedup = 7,     // no store change: the dedup window as it was (replaces the window)
};

struct JournalRecord {
  JournalOp op;
  std::string_view body;  // points into the parsed bytes
};

// The 8-byte file header.
std::string JournalFileHeader();
// The 9-byte header of a record whose body is `body`; write the body right after it.
std::string JournalRecordHeader(JournalOp op, std::string_view body);
// The same for a body in pieces: `body`'s head, then its tail slices.
std::string JournalRecordHeader(JournalOp op, const Payload& body);
// Body of a kCovers record, and its segment number (kInvalidArgument: not 8 bytes).
std::string EncodeJournalCovers(uint64_t segment);
Result<uint64_t> DecodeJournalCovers(std::string_view body);
// Everything of a kPushId record before its kv-pairs body `kv`: the record header (its
// checksum covers the id and kv) and the id. Write kv right after it.
std::string JournalPushIdHead(const PushId& id, std::string_view kv);
// Body of a kDrop record.
std::string EncodeJournalDrop(int rank, int num_servers);
// Body of a kDropKeys record.
std::string EncodeJournalDropKeys(const std::vector<uint64_t>& keys);

struct ParsedJournal {
  std::vector<JournalRecord> records;
  size_t valid_bytes = 0;  // file header + whole records; anything after is a torn tail
};

// Parses a whole journal file. kInvalidArgument names what is damaged and where.
Result<ParsedJournal> ParseJournal(std::string_view bytes);

// Applies the records in order to `store`. A push record is applied exactly as it was
// when served (a key of the wrong length is skipped again, the others applied).
// kInvalidArgument when a body does not decode (the record index is named). With `dedup`,
// kPushId and kDedup records rebuild the push window too.
Status ReplayJournal(const std::vector<JournalRecord>& records, ParamStore* store, PushDedup* dedup = nullptr);

}  // namespace pscore::core
