// Converts libuv's negative return codes to Status, once, at the comm boundary; and the
// small handle helpers the comm sources share.
// Included only by comm/*.cc.
#pragma once

#include <uv.h>

#include <string>

#include "pscore/core/status.h"

namespace pscore::comm {

inline Status UvStatus(int rc, const std::string& what) {
  if (rc >= 0) return Status::Ok();
  Code code = Code::kUnavailable;
  if (rc == UV_ETIMEDOUT) code = Code::kTimeout;
  if (rc == UV_EINVAL || rc == UV_EADDRNOTAVAIL) code = Code::kInvalidArgument;
  if (rc == UV_ENOMEM || rc == UV_EMFILE || rc == UV_ENFILE || rc == UV_ENOBUFS) {
    code = Code::kResourceExhausted;
  }
  return Status(code, what + ": " + uv_strerror(rc));
}

// Closes a heap-allocated TCP handle nobody owns yet (a failed dial or a refused accept)
// and frees it in the close callback.
inline void CloseAndFree(uv_tcp_t* tcp) {
  tcp->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(tcp), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
}

}  // namespace pscore::comm
