// Optional TLS (OpenSSL's libssl) for braid's TCP connections: the TCP transport's sockets
// and the bootstrap store's. Off unless configured (BRAID_TLS=1 with BRAID_TLS_CERT,
// BRAID_TLS_KEY and BRAID_TLS_CA; docs/reliability.md, "TLS").
//
// Both ends present a certificate and verify the other's against the configured CA
// (mutual TLS, TLS 1.3 only), as Gloo's TLS transport does: the CA is the trust root, so
// no host name is checked (ranks connect by address). The job's token is still proven
// inside the connection (base/auth.hpp): a certificate says "a host of this cluster", the
// token "a rank of this job".
//
// A Session works on a non-blocking socket and answers like the system calls it replaces
// (read, write, writev), so the callers' readiness loops keep their shape; the one
// difference is noted at read().
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>

namespace braid::base::tls {

/// Where the certificate chain, its private key and the CA bundle are (PEM files).
struct Files {
  std::string cert;
  std::string key;
  std::string ca;
};

/// The configured credentials and policy, shared by every session of a process. Safe to
/// use from several threads (sessions are not).
class Context {
 public:
  /// Loads `files`; throws Error(InvalidUsage) naming the file and OpenSSL's reason when
  /// one is missing, unreadable, not PEM, or the key does not match the certificate.
  explicit Context(const Files& files);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Files& files() const noexcept { return files_; }
  /// The OpenSSL SSL_CTX (opaque here, so that callers need no OpenSSL header).
  void* native() const noexcept { return ctx_; }

 private:
  Files files_;
  void* ctx_ = nullptr;
};

/// One TLS connection on a connected, non-blocking socket it does not own.
class Session {
 public:
  /// `server`: this end accepted the TCP connection. Throws Error(System) when OpenSSL
  /// cannot make the session.
  Session(const Context& ctx, int fd, bool server);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  enum class Step { done, want_read, want_write, failed };
  /// Advances the handshake; call again on the readiness it asks for. After `failed`,
  /// error() says why (a certificate the CA did not sign, no certificate, not TLS...).
  Step handshake();
  bool established() const noexcept { return established_; }

  /// As read(2) on the socket: > 0 bytes of plaintext, 0 at the end of the stream (the
  /// peer's close_notify or a bare TCP close between records), -1 with errno EAGAIN when
  /// no whole record is available yet, EPROTO for a TLS failure (a record that does not
  /// authenticate: error() has OpenSSL's reason), or the socket's errno. Unlike read(2),
  /// a short count does not mean the socket is drained (a record ended): only EAGAIN does.
  ssize_t read(void* buf, std::size_t n);
  /// As readv(2), with read()'s meaning.
  ssize_t readv(const iovec* iov, int n);
  /// As writev(2) on the socket: bytes of plaintext accepted (>= 1), or -1 with errno
  /// EAGAIN (the socket is full: wait for it to be writable), EPROTO or the socket's
  /// errno. Small pieces are gathered into records of up to 16 KiB, so a header and its
  /// payload travel in one record. After EAGAIN the next call must offer at least the
  /// same bytes (OpenSSL has already sealed them into a record).
  ssize_t writev(const iovec* iov, int n);
  ssize_t write(const void* buf, std::size_t n) {
    iovec v{const_cast<void*>(buf), n};
    return writev(&v, 1);
  }
  /// Why the last call failed (EPROTO or a failed handshake).
  const std::string& error() const noexcept { return error_; }
  /// "TLSv1.3 TLS_AES_256_GCM_SHA384, peer CN=..." once established.
  std::string describe() const;

 private:
  ssize_t io_result(int ret, bool reading);

  void* ssl_ = nullptr;
  bool established_ = false;
  std::string error_;
  std::unique_ptr<unsigned char[]> record_;  // gathers a writev into one record
};

}  // namespace braid::base::tls
