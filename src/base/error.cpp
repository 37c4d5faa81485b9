// braid::Error and its subclasses.
#include <braid/error.hpp>

namespace braid {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidUsage: return "InvalidUsage";
    case ErrorCode::Unsupported: return "Unsupported";
    case ErrorCode::Timeout: return "Timeout";
    case ErrorCode::Aborted: return "Aborted";
    case ErrorCode::RemoteError: return "RemoteError";
    case ErrorCode::System: return "System";
    case ErrorCode::Cuda: return "Cuda";
    case ErrorCode::Network: return "Network";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error("braid " + std::string(to_string(code)) + ": " + message), code_(code) {}
Error::~Error() = default;

TimeoutError::TimeoutError(const std::string& message) : Error(ErrorCode::Timeout, message) {}
TimeoutError::~TimeoutError() = default;

RemoteError::RemoteError(int peer, const std::string& message)
    : Error(ErrorCode::RemoteError, message), peer_(peer) {}
RemoteError::~RemoteError() = default;

}  // namespace braid
