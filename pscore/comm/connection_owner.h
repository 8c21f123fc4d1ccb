// ConnectionOwner: what a Connection reports to the table that owns it (the Transport),
// and the ledger its reads and writes are counted in. Loop thread only. A Connection
// calls it until its owner lets go of it (OnClosing, then Connection::Detach).
#pragma once

#include <cstdint>
#include <memory>

#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/transport_types.h"

namespace pscore::comm {

class TransportLedger;

class ConnectionOwner {
 public:
  virtual TransportLedger& ledger() = 0;
  // The frame decoder's tail sink and stream (FrameDecoder::SinkFn / StreamFn), when the
  // owner has them.
  virtual bool has_sink() const = 0;
  virtual char* SinkFor(ConnId id, const pb::MessageMeta& meta, uint64_t tail) = 0;
  virtual bool has_stream() const = 0;
  virtual std::shared_ptr<TailStream> StreamFor(ConnId id, const pb::MessageMeta& meta, uint64_t tail) = 0;
  // The TLS handshake finished: on to the token handshake, or open.
  virtual void OnTlsEstablished(ConnId id) = 0;
  virtual void OnFrame(ConnId id, Frame&& frame) = 0;
  // Frames were queued: flush the connection before the loop next polls.
  virtual void OnFramesQueued(ConnId id) = 0;
  // The connection is closing: the owner lets go of it (and detaches it).
  virtual void OnClosing(ConnId id, const Status& why) = 0;

 protected:
  ~ConnectionOwner() = default;
};

}  // namespace pscore::comm
