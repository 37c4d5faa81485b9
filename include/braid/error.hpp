// braid — errors. Every failure surfaces as a braid::Error carrying an ErrorCode
// and a message that names, where known, the rank, the peer, the collective,
// its sequence number and what to do about it.
#pragma once

#include <braid/export.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace braid {

/// Classifies a failure so that callers can react without parsing messages.
enum class ErrorCode : int {
  InvalidUsage = 1,  ///< Bad arguments or a call in the wrong state; nothing was sent.
  Unsupported,       ///< Valid request that this build or version does not implement.
  Timeout,           ///< A deadline passed (BRAID_TIMEOUT or a per-call timeout).
  Aborted,           ///< The communicator was aborted (abort() or an earlier failure).
  RemoteError,       ///< A peer failed, died or closed its connection.
  System,            ///< A system call failed (errno text is in the message).
  Cuda,              ///< A CUDA call failed.
  Network,           ///< A network-level failure: refused, unreachable, bad wire data.
  Internal,          ///< A braid bug; please report it with the message.
};

/// Canonical name of an error code ("InvalidUsage", ...).
BRAID_API std::string_view to_string(ErrorCode code) noexcept;

/// The one exception type braid throws. Thread-safe to copy and inspect.
class BRAID_API Error : public std::runtime_error {
 public:
  /// Builds an error; `message` should say what happened and what to do.
  Error(ErrorCode code, const std::string& message);
  ~Error() override;
  /// Copyable, as exceptions must be.
  Error(const Error&) = default;
  /// Copyable, as exceptions must be.
  Error& operator=(const Error&) = default;

  /// The classification of this error.
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

/// A deadline passed. Thrown with ErrorCode::Timeout.
class BRAID_API TimeoutError : public Error {
 public:
  /// Builds a timeout error with the given message.
  explicit TimeoutError(const std::string& message);
  ~TimeoutError() override;
};

/// A peer failed. `peer()` is the rank that was found dead or that reported the failure,
/// or -1 when unknown. Thrown with ErrorCode::RemoteError.
class BRAID_API RemoteError : public Error {
 public:
  /// Builds a remote error naming `peer`.
  RemoteError(int peer, const std::string& message);
  ~RemoteError() override;
  /// The rank this error blames, or -1.
  int peer() const noexcept { return peer_; }

 private:
  int peer_;
};

}  // namespace braid
