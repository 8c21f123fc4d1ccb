// KeyIndices: which of a pull's keys one of its parts asks a server for, in increasing
// order. A run of consecutive keys (all of a request's keys for its only server, the
// common case) is two numbers; other sets are listed. A pull of ten million keys for one
// server so writes and reads no array of ten million indices.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace pscore::node {

class KeyIndices {
 public:
  KeyIndices() = default;
  // Keys [first, first + count).
  static KeyIndices Run(size_t first, size_t count) {
    KeyIndices k;
    k.first_ = first;
    k.count_ = count;
    return k;
  }
  // The keys listed (increasing).
  static KeyIndices Listed(std::vector<size_t> listed) {
    KeyIndices k;
    k.listed_ = true;
    k.list_ = std::move(listed);
    return k;
  }

  size_t size() const { return listed_ ? list_.size() : count_; }
  bool empty() const { return size() == 0; }
  size_t operator[](size_t j) const { return listed_ ? list_[j] : first_ + j; }
  size_t front() const { return (*this)[0]; }
  size_t back() const { return (*this)[size() - 1]; }
  // Every key from front() to back() (a run, or a list that happens to be one).
  bool consecutive() const { return !empty() && back() - front() + 1 == size(); }
  // The listed array, for reuse (empty for a run); this one is left empty.
  std::vector<size_t> Release() {
    std::vector<size_t> out = std::move(list_);
    *this = KeyIndices();
    return out;
  }

 private:
  bool listed_ = false;
  size_t first_ = 0;
  size_t count_ = 0;
  std::vector<size_t> list_;
};

}  // namespace pscore::node
