#include "pscore/node/worker/kv_request.h"

namespace pscore::node {

KvRequest::KvRequest(Kind kind, KvCounters counters) : kind_(kind), counters_(std::move(counters)) {
  counters_.in_flight->fetch_add(1, std::memory_order_acq_rel);
}

void KvRequest::CountOut() {
  if (!counted_) return;
  counted_ = false;
  counters_.in_flight->fetch_sub(1, std::memory_order_acq_rel);
}

void KvRequest::Fail(const Status& st) {
  if (finished) return;
  finished = true;
  Abandon();
  if (DeferFailure()) {
    failure_ = st;  // settled by PartEnded once no answer can write into the caller's memory
    return;
  }
  CountOut();
  Settle(st);
}

bool KvRequest::PartEnded() {
  --parts_sent;
  if (!finished) return true;
  if (failure_ && parts_sent == 0) {
    CountOut();
    Settle(*failure_);
    failure_.reset();
  }
  return false;
}

void KvRequest::Acked(size_t n) {
  outstanding -= n;
  if (outstanding != 0 || finished) return;
  finished = true;
  CountOut();
  Complete();
}

KvPart KvPart::Successor() const {
  KvPart p;
  // A part split again after a scale: if this one was sent, a server may have applied it.
  p.origin_seq = push_seq != 0 ? push_seq : origin_seq;
  p.lost_since = lost_since;
  p.attempts = attempts;
  p.lost_server = lost_server;
  p.lost = lost;
  return p;
}

}  // namespace pscore::node
