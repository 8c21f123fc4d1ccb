#include "pscore/core/status.h"

namespace pscore {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kProtocol: return "protocol";
    case Code::kUnavailable: return "unavailable";
    case Code::kTimeout: return "timeout";
    case Code::kResourceExhausted: return "resource_exhausted";
    case Code::kInternal: return "internal";
    case Code::kNotFound: return "not_found";
    case Code::kAlreadyExists: return "already_exists";
    case Code::kCancelled: return "cancelled";
    case Code::kFailedPrecondition: return "failed_precondition";
    case Code::kPermissionDenied: return "permission_denied";
    case Code::kAborted: return "aborted";
    case Code::kUnimplemented: return "unimplemented";
  }
  return "unknown";
}

Code CodeFromInt(int32_t value) {
  if (value < 0 || value > static_cast<int32_t>(Code::kUnimplemented)) return Code::kInternal;
  return static_cast<Code>(value);
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

std::ostream& operator<<(std::ostream& os, const Status& status) {
  return os << status.ToString();
}

}  // namespace pscore
