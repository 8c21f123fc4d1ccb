#include "pscore/core/push_dedup.h"

#include <algorithm>

#include "pscore/core/endian.h"

namespace pscore::core {

std::string ToString(const PushId& id) {
  return id.writer + "/" + std::to_string(id.incarnation) + "/" + std::to_string(id.seq);
}

PushDedup::Writer* PushDedup::WindowFor(const PushId& id) {
  auto it = writers_.find(id.writer);
  if (it == writers_.end()) {
    if (writers_.size() >= kMaxWriters) return nullptr;
    it = writers_.emplace(id.writer, Writer()).first;
    it->second.incarnation = id.incarnation;
  }
  Writer& w = it->second;
  if (w.incarnation != id.incarnation) w = Writer{id.incarnation, 0, {}, {}};
  return &w;
}

void PushDedup::Insert(Writer* w, uint64_t seq) {
  if (seq <= w->floor) return;
  w->applied.insert(seq);
  while (w->applied.size() > kWindow) {
    w->floor = *w->applied.begin();
    w->applied.erase(w->applied.begin());
  }
}

PushDedup::Verdict PushDedup::Begin(const PushId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Writer* w = WindowFor(id);
  if (w == nullptr) return Verdict::kFull;
  if (w->applied.count(id.seq)) return Verdict::kApplied;
  if (w->in_flight.count(id.seq)) return Verdict::kInFlight;
  if (id.seq <= w->floor) return Verdict::kTooOld;
  w->in_flight.insert(id.seq);
  return Verdict::kApply;
}

void PushDedup::End(const PushId& id, bool applied) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writers_.find(id.writer);
  // A newer incarnation of the writer has replaced the window meanwhile: nothing to end.
  if (it == writers_.end() || it->second.incarnation != id.incarnation) return;
  it->second.in_flight.erase(id.seq);
  if (applied) Insert(&it->second, id.seq);
}

void PushDedup::MarkApplied(const PushId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Writer* w = WindowFor(id);
  if (w != nullptr) Insert(w, id.seq);
}

std::string PushDedup::Encode() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out(4, '\0');
  PutLe(writers_.size(), 4, &out[0]);
  for (const auto& [name, w] : writers_) {
    std::string head(2 + name.size() + 20, '\0');
    PutLe(name.size(), 2, &head[0]);
    head.replace(2, name.size(), name);
    PutLe(w.incarnation, 8, &head[2 + name.size()]);
    PutLe(w.floor, 8, &head[10 + name.size()]);
    PutLe(w.applied.size(), 4, &head[18 + name.size()]);
    out += head;
    std::string seqs(8 * w.applied.size(), '\0');
    size_t at = 0;
    for (uint64_t s : w.applied) {
      PutLe(s, 8, &seqs[at]);
      at += 8;
    }
    out += seqs;
  }
  return out;
}

Status PushDedup::DecodeInto(std::string_view bytes, Windows* windows) {
  auto bad = [](const std::string& what) { return Status(Code::kInvalidArgument, "push window: " + what); };
  size_t at = 0;
  auto need = [&](size_t n) { return bytes.size() - at >= n; };
  if (!need(4)) return bad("shorter than its writer count");
  const uint64_t count = GetLe(bytes.data(), 4);
  at = 4;
  if (count > kMaxWriters) return bad(std::to_string(count) + " writers, over " + std::to_string(kMaxWriters));
  Windows& out = *windows;
  for (uint64_t i = 0; i < count; ++i) {
    if (!need(2)) return bad("writer " + std::to_string(i) + " cut short");
    const size_t len = GetLe(bytes.data() + at, 2);
    at += 2;
    if (len > kMaxWriterBytes || !need(len + 20)) return bad("writer " + std::to_string(i) + " cut short");
    std::string name(bytes.substr(at, len));
    at += len;
    Writer w;
    w.incarnation = GetLe(bytes.data() + at, 8);
    w.floor = GetLe(bytes.data() + at + 8, 8);
    const uint64_t seqs = GetLe(bytes.data() + at + 16, 4);
    at += 20;
    if (seqs > kWindow || !need(8 * seqs)) return bad("writer '" + name + "': " + std::to_string(seqs) + " seqs");
    for (uint64_t j = 0; j < seqs; ++j) {
      const uint64_t s = GetLe(bytes.data() + at, 8);
      at += 8;
      if (s > w.floor) w.applied.insert(s);
    }
    out[std::move(name)] = std::move(w);
  }
  if (at != bytes.size()) return bad(std::to_string(bytes.size() - at) + " bytes after the last writer");
  return Status::Ok();
}

Status PushDedup::Decode(std::string_view bytes) {
  Windows out;
  Status st = DecodeInto(bytes, &out);
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  writers_ = std::move(out);
  return Status::Ok();
}

Status PushDedup::Merge(std::string_view bytes) {
  Windows in;
  Status st = DecodeInto(bytes, &in);
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, w] : in) {
    auto it = writers_.find(name);
    if (it == writers_.end()) {
      if (writers_.size() >= kMaxWriters) continue;  // as Begin: such a writer's pushes are refused
      writers_.emplace(name, std::move(w));
      continue;
    }
    Writer& have = it->second;
    if (w.incarnation != have.incarnation) {
      if (w.incarnation > have.incarnation) have = std::move(w);
      continue;
    }
    have.floor = std::max(have.floor, w.floor);
    have.applied.insert(w.applied.begin(), w.applied.end());
    while (!have.applied.empty() && *have.applied.begin() <= have.floor) have.applied.erase(have.applied.begin());
    while (have.applied.size() > kWindow) {
      have.floor = *have.applied.begin();
      have.applied.erase(have.applied.begin());
    }
  }
  return Status::Ok();
}

size_t PushDedup::writers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writers_.size();
}

bool PushDedup::Applied(const PushId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writers_.find(id.writer);
  return it != writers_.end() && it->second.incarnation == id.incarnation && it->second.applied.count(id.seq) > 0;
}

}  // namespace pscore::core
