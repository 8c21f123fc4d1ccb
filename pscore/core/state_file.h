// State file codec: frames a pb::PersistedState (the scheduler's membership, cluster state,
// epoch, totals, KV store and barriers' last ended rounds) with a magic, a format version, a length and a CRC-32, and
// validates all of it on the way back in. Pure functions, any thread; no I/O here (the
// writer thread is pscore/node/scheduler/state_writer.h).
//
// Layout (little-endian):
//   | magic u32 "PSST" | version u32 | body_len u64 | crc32(body) u32 |  20 bytes
//   | body: pb::PersistedState, body_len bytes                         |
// The file must be exactly 20 + body_len bytes; every count and size in the body is
// bounded (see kMax* below) so a damaged or hostile file cannot make the loader allocate
// without limit or hand the cluster an impossible registry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/kv_store.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::core {

inline constexpr uint32_t kStateMagic = 0x54535350;  // "PSST" read as little-endian bytes
inline constexpr uint32_t kStateVersion = 1;
inline constexpr size_t kStateHeaderBytes = 20;
inline constexpr int kMaxStateNodes = 1 << 16;
inline constexpr int kMaxStateDevicesPerNode = 4096;
inline constexpr int kMaxStateKvEntries = 1 << 20;
// Protobuf framing of one KvEntry inside the body, at most: the entry's tag (1 byte) and
// length (a varint; an entry is under 2^35 bytes: 5), the key's tag and length (1 + 2: a key
// is at most kMaxKeyBytes = 4096 < 2^14) and the value's tag and length (1 + 5).
inline constexpr uint64_t kMaxStateKvEntryOverheadBytes = 15;
// The KV section of a body when the store is as full as it may be: every byte it may hold
// plus the framing of the most entries (1 GiB + 15 MiB).
inline constexpr uint64_t kMaxStateKvBytes =
    kMaxKvTotalBytes + uint64_t{kMaxStateKvEntries} * kMaxStateKvEntryOverheadBytes;
// Room for everything else: membership (up to kMaxStateNodes nodes with their devices),
// the last processes scale-ins removed, cluster state, totals, the scale operation.
inline constexpr uint64_t kMaxStateMembershipBytes = 512ull << 20;
inline constexpr uint64_t kMaxStateBodyBytes = kMaxStateKvBytes + kMaxStateMembershipBytes;
static_assert(kMaxStateBodyBytes <= 0x7fffffff, "protobuf parses at most 2^31 - 1 bytes");
inline constexpr int kMaxStateRoleTotal = kMaxRoleTotal;
inline constexpr size_t kMaxStateNodeIdBytes = 256;
// Barrier ids with their newest ended round (BarrierLimits::max_ended_ids), and the bytes of
// one id and of one round's result message.
inline constexpr int kMaxStateBarriers = 65536;
inline constexpr size_t kMaxStateBarrierIdBytes = 4096;
inline constexpr size_t kMaxStateBarrierMessageBytes = 4096;
// Per-node rounds kept over all barrier ids (PersistedBarrier.joined); a writer past it
// leaves the rest out (those nodes resume their count from 0).
inline constexpr int kMaxStateBarrierJoins = 1 << 20;

// CRC-32 (IEEE 802.3, reflected: zlib's crc32, which computes it) of data; given the CRC
// of the bytes before data as `crc`, the CRC of both (so a record need not be contiguous).
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

// Frames state as a state file (header + body).
std::string SerializeState(const pb::PersistedState& state);

// Parses and validates a whole state file. Errors are kInvalidArgument (damaged: bad magic,
// wrong length, checksum mismatch, unparsable body, out-of-bounds count or value) or
// kUnimplemented (a format version this build does not read); the message says what.
Result<pb::PersistedState> ParseState(std::string_view bytes);

// The body checks alone (already parsed): bounded counts, known roles and states, unique
// node ids and unique ranks per role.
Status ValidateState(const pb::PersistedState& state);

}  // namespace pscore::core
