// RowLens: the float count of each key of a batch, as an array (one per key) or as one
// length that every key holds (rows of one length: a push that carries row_len in place of
// lens on the wire, docs/protocol.md). An array converts to it implicitly, so code that
// holds lens as an array passes them as before.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pscore {
namespace core {

class RowLens {
 public:
  // lens[i] for key i; null: absent (a batch without lengths).
  RowLens(const uint32_t* lens = nullptr) : each_(lens) {}  // implicit: an array is one
  // Every key holds `len` floats.
  static RowLens All(uint32_t len) {
    RowLens r;
    r.all_ = len;
    r.uniform_ = true;
    return r;
  }

  uint32_t operator[](size_t i) const { return each_ != nullptr ? each_[i] : all_; }
  bool present() const { return each_ != nullptr || uniform_; }
  // The array, or null for rows of one length (and when absent).
  const uint32_t* each() const { return each_; }
  bool uniform() const { return uniform_; }

 private:
  const uint32_t* each_ = nullptr;
  uint32_t all_ = 0;
  bool uniform_ = false;
};

}  // namespace core
}  // namespace pscore
