#include "base/tls.hpp"

#include <braid/error.hpp>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace braid::base::tls {
namespace {

constexpr std::size_t kRecord = 16384;  // TLS's largest record of plaintext

/// OpenSSL's queued reasons, oldest first, emptied.
std::string openssl_errors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no reason given" : out;
}

// The socket BIO, our own so that a write to a peer that has gone never raises SIGPIPE
// (OpenSSL's writes with write(2); braid sends with MSG_NOSIGNAL everywhere, since it is
// a library and the process's signal dispositions are not its own).
int bio_write(BIO* b, const char* data, size_t n, size_t* written) {
  BIO_clear_retry_flags(b);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  for (;;) {
    const ssize_t r = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) {
      *written = static_cast<size_t>(r);
      return 1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return 0;
  }
}

int bio_read(BIO* b, char* data, size_t n, size_t* got) {
  BIO_clear_retry_flags(b);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  for (;;) {
    const ssize_t r = ::recv(fd, data, n, MSG_DONTWAIT);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return 1;
    }
    if (r == 0) {
      *got = 0;
      errno = 0;  // the end of the stream, not an error
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return 0;
  }
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int bio_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

BIO_METHOD* socket_method() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* b = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "braid socket");
    if (b == nullptr) return b;
    BIO_meth_set_write_ex(b, bio_write);
    BIO_meth_set_read_ex(b, bio_read);
    BIO_meth_set_ctrl(b, bio_ctrl);
    BIO_meth_set_create(b, bio_create);
    return b;
  }();
  return m;
}

std::string readable_file(const std::string& what, const std::string& path) {
  if (path.empty()) return what + " is not set";
  if (::access(path.c_str(), R_OK) != 0) return what + " '" + path + "' cannot be read: " + std::strerror(errno);
  return {};
}

}  // namespace

Context::Context(const Files& files) : files_(files) {
  for (const auto& [what, path] : {std::pair<const char*, const std::string&>{"BRAID_TLS_CERT", files.cert},
                                   {"BRAID_TLS_KEY", files.key},
                                   {"BRAID_TLS_CA", files.ca}}) {
    const std::string why = readable_file(what, path);
    if (!why.empty())
      throw Error(ErrorCode::InvalidUsage,
                  "TLS (BRAID_TLS=1): " + why + "; give the PEM files of this host's certificate chain, its key and "
                                                "the CA that signed every rank's certificate");
  }
  ERR_clear_error();
  SSL_CTX* c = SSL_CTX_new(TLS_method());
  if (c == nullptr) throw Error(ErrorCode::System, "TLS: SSL_CTX_new failed: " + openssl_errors());
  ctx_ = c;
  auto fail = [&](const std::string& what) {
    const std::string why = openssl_errors();
    SSL_CTX_free(c);
    ctx_ = nullptr;
    throw Error(ErrorCode::InvalidUsage, "TLS (BRAID_TLS=1): " + what + ": " + why);
  };
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  // Partial writes: writev hands OpenSSL one record at a time and learns what went out.
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // No session tickets: nothing resumes, and a ticket would be a record the reader must
  // consume before the first byte of data. A TCP close between records is an end of
  // stream (braid closes sockets without close_notify; a close inside a message is still
  // an error, seen by the message framing).
  SSL_CTX_set_num_tickets(c, 0);
  // Read ahead: one recv takes whatever records have arrived (64 KiB at a time) instead of
  // two per record (header, then body). A read that must wait still means the socket is
  // drained, which is what the callers' edge-triggered loops rely on.
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 64 * 1024);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (SSL_CTX_use_certificate_chain_file(c, files.cert.c_str()) != 1)
    fail("BRAID_TLS_CERT '" + files.cert + "' is not a PEM certificate chain");
  if (SSL_CTX_use_PrivateKey_file(c, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    fail("BRAID_TLS_KEY '" + files.key + "' is not a PEM private key, or not the key of BRAID_TLS_CERT '" +
         files.cert + "'");
  if (SSL_CTX_check_private_key(c) != 1)
    fail("BRAID_TLS_KEY '" + files.key + "' is not the key of BRAID_TLS_CERT '" + files.cert + "'");
  if (SSL_CTX_load_verify_locations(c, files.ca.c_str(), nullptr) != 1)
    fail("BRAID_TLS_CA '" + files.ca + "' is not a PEM CA bundle");
  // Mutual: each end presents a certificate and checks the other's against the CA.
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

Context::~Context() { SSL_CTX_free(static_cast<SSL_CTX*>(ctx_)); }

Session::Session(const Context& ctx, int fd, bool server) {
  ERR_clear_error();
  SSL* s = SSL_new(static_cast<SSL_CTX*>(ctx.native()));
  BIO* b = socket_method() != nullptr ? BIO_new(socket_method()) : nullptr;
  if (s == nullptr || b == nullptr) {
    const std::string why = openssl_errors();
    if (s != nullptr) SSL_free(s);
    if (b != nullptr) BIO_free(b);
    throw Error(ErrorCode::System, "TLS: cannot make a session: " + why);
  }
  BIO_set_data(b, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(s, b, b);  // the session owns the BIO (one reference, both directions)
  if (server)
    SSL_set_accept_state(s);
  else
    SSL_set_connect_state(s);
  ssl_ = s;
}

Session::~Session() { SSL_free(static_cast<SSL*>(ssl_)); }

Session::Step Session::handshake() {
  if (established_) return Step::done;
  SSL* s = static_cast<SSL*>(ssl_);
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(s);
  if (r == 1) {
    established_ = true;
    return Step::done;
  }
  const int e = SSL_get_error(s, r);
  if (e == SSL_ERROR_WANT_READ) return Step::want_read;
  if (e == SSL_ERROR_WANT_WRITE) return Step::want_write;
  const long verify = SSL_get_verify_result(s);
  if (verify != X509_V_OK) {
    error_ = std::string("the peer's certificate does not verify against BRAID_TLS_CA: ") +
             X509_verify_cert_error_string(verify);
    ERR_clear_error();
  } else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN) {
    error_ = errno != 0 ? std::string("socket error: ") + std::strerror(errno)
                        : "the peer closed the connection during the TLS handshake (does it use TLS, with a "
                          "certificate this end's CA signed?)";
    ERR_clear_error();
  } else {
    error_ = openssl_errors();
  }
  return Step::failed;
}

ssize_t Session::io_result(int ret, bool reading) {
  SSL* s = static_cast<SSL*>(ssl_);
  const int saved = errno;
  const int e = SSL_get_error(s, ret);
  switch (e) {
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      if (saved == 0) {
        if (reading) return 0;
        errno = EPIPE;
        return -1;
      }
      errno = saved;
      return -1;
    default:
      error_ = openssl_errors();
      errno = EPROTO;
      return -1;
  }
}

ssize_t Session::readv(const iovec* iov, int n) {
  SSL* s = static_cast<SSL*>(ssl_);
  std::size_t total = 0;
  for (int i = 0; i < n; ++i) {
    auto* p = static_cast<unsigned char*>(iov[i].iov_base);
    std::size_t off = 0;
    // Record by record until this piece is full or nothing more is there, so that a
    // short count means what it means for readv(2): the socket is drained.
    while (off < iov[i].iov_len) {
      ERR_clear_error();
      errno = 0;
      std::size_t got = 0;
      const int r = SSL_read_ex(s, p + off, iov[i].iov_len - off, &got);
      if (r != 1) {
        const ssize_t e = io_result(r, true);
        return total > 0 ? static_cast<ssize_t>(total) : e;
      }
      off += got;
      total += got;
    }
  }
  return static_cast<ssize_t>(total);
}

ssize_t Session::read(void* buf, std::size_t n) {
  iovec v{buf, n};
  return readv(&v, 1);
}

ssize_t Session::writev(const iovec* iov, int n) {
  SSL* s = static_cast<SSL*>(ssl_);
  if (!record_) record_ = std::make_unique<unsigned char[]>(kRecord);
  std::size_t total = 0;
  int i = 0;
  std::size_t off = 0;  // into iov[i]
  auto skip_empty = [&] {
    while (i < n && off == iov[i].iov_len) {
      ++i;
      off = 0;
    }
  };
  skip_empty();
  while (i < n) {
    // The next record: straight from the caller's memory when a whole one is there (no
    // copy for payloads), else gathered (a header with the start of its payload).
    const unsigned char* data = nullptr;
    std::size_t len = 0;
    const auto* here = static_cast<const unsigned char*>(iov[i].iov_base) + off;
    if (iov[i].iov_len - off >= kRecord) {
      data = here;
      len = kRecord;
    } else {
      int j = i;
      std::size_t o = off;
      while (j < n && len < kRecord) {
        const std::size_t take = std::min(iov[j].iov_len - o, kRecord - len);
        std::memcpy(record_.get() + len, static_cast<const unsigned char*>(iov[j].iov_base) + o, take);
        len += take;
        o += take;
        if (o == iov[j].iov_len) {
          ++j;
          o = 0;
        }
      }
      data = record_.get();
    }
    ERR_clear_error();
    errno = 0;
    std::size_t written = 0;
    const int r = SSL_write_ex(s, data, len, &written);
    if (r != 1) {
      const ssize_t e = io_result(r, false);
      return total > 0 ? static_cast<ssize_t>(total) : e;
    }
    total += written;
    // Advance past `written` bytes.
    std::size_t left = written;
    while (left > 0 && i < n) {
      const std::size_t k = std::min(left, iov[i].iov_len - off);
      off += k;
      left -= k;
      skip_empty();
    }
  }
  return static_cast<ssize_t>(total);
}

std::string Session::describe() const {
  SSL* s = static_cast<SSL*>(ssl_);
  std::string out = std::string(SSL_get_version(s)) + " " + SSL_CIPHER_get_name(SSL_get_current_cipher(s));
  if (X509* peer = SSL_get1_peer_certificate(s)) {
    char name[256] = {};
    X509_NAME_oneline(X509_get_subject_name(peer), name, sizeof name);
    out += std::string(", peer ") + name;
    X509_free(peer);
  }
  return out;
}

}  // namespace braid::base::tls
