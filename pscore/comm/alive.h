// AliveToken: lets a deferred callback (timer, posted closure, close watcher) tell whether
// the object that scheduled it still exists. The owner holds the token as a member; the
// callback captures watch() and returns early once the owner is gone (or called
// Expire()). Checked on the thread that destroys the owner (its loop thread), so a
// check cannot race the destruction.
#pragma once

#include <memory>

namespace pscore::comm {

class AliveToken {
 public:
  class Watch {
   public:
    Watch() = default;
    bool alive() const { return !flag_.expired(); }
    explicit operator bool() const { return alive(); }

   private:
    friend class AliveToken;
    explicit Watch(std::weak_ptr<const void> flag) : flag_(std::move(flag)) {}
    std::weak_ptr<const void> flag_;
  };

  AliveToken() = default;
  AliveToken(const AliveToken&) = delete;
  AliveToken& operator=(const AliveToken&) = delete;

  Watch watch() const { return Watch(flag_); }
  // Every watch taken reads "gone" from now on (an owner that shuts down before it dies).
  void Expire() { flag_.reset(); }
  bool expired() const { return flag_ == nullptr; }

 private:
  std::shared_ptr<const void> flag_ = std::make_shared<char>(0);
};

}  // namespace pscore::comm
