// braid — key-value stores used to bootstrap communicators.
//
// A store carries only connection set-up (addresses, tokens, counters), never
// collective data. Every blocking call has a deadline and throws
// braid::TimeoutError naming the keys it waited for when it passes.
#pragma once

#include <braid/export.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid {

/// Abstract key-value store with blocking reads.
///
/// Thread safety: every implementation in braid is safe to call from several
/// threads at once. Values are arbitrary bytes held in std::string.
class BRAID_API Store {
 public:
  virtual ~Store();

  /// Sets `key` to `value`, replacing any previous value, and wakes waiters.
  virtual void set(const std::string& key, const std::string& value) = 0;

  /// Returns the value of `key`, waiting up to `timeout` for it to be set.
  /// Throws TimeoutError when it does not appear in time.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  /// Atomically adds `delta` to the integer stored at `key` (missing = 0) and
  /// returns the new value. The value is kept as decimal text.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;

  /// True when every key in `keys` is set; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  /// Waits until every key in `keys` is set, up to `timeout`; throws TimeoutError
  /// naming the missing keys otherwise.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  /// Removes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;

  /// Atomically: sets `key` to `desired` when its value equals `expected`, where an empty
  /// `expected` matches a missing key; returns the value the key holds afterwards ("" when
  /// it is missing). The first of several callers with expected "" wins, and every caller
  /// learns what won: the agreement behind Communicator::shrink(). c10d's compare_set.
  /// The default throws Error(Unsupported): a store of your own that lacks it still
  /// bootstraps communicators, it only cannot shrink them.
  virtual std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
};

/// A TCP store server: an in-memory map behind a listening socket, served by a
/// background thread. Standalone (a launcher can run one) or owned by a TcpStore
/// created with `is_server`.
///
/// Lifetime: the server stops and closes every client connection in its destructor.
class BRAID_API TcpStoreServer {
 public:
  /// Listens on `bind_addr`:`port`: an address, or several separated by commas (port 0
  /// picks a free one, the same on each; "0.0.0.0" binds every interface). With a `token`,
  /// serves only clients that prove they know it (mutual HMAC-SHA-256 challenge and
  /// response; the token never travels): others are refused and logged at WARN. Limits
  /// from BRAID_STORE_HELLO_TIMEOUT, _MAX_PENDING, _MAX_KEYS, _MAX_BYTES. With BRAID_TLS=1
  /// every connection must first complete a TLS handshake (mutual, against BRAID_TLS_CA),
  /// within the same hello deadline. Throws Error(Network) when an address cannot be
  /// bound, InvalidUsage when a BRAID_TLS_* file does not fit.
  TcpStoreServer(const std::string& bind_addr, std::uint16_t port, const std::string& token = {});
  /// Stops serving and closes every client connection.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The port actually bound.
  std::uint16_t port() const noexcept;

  /// Private implementation.
  struct Impl;
  /// braid's own: a server made inside the library with settings given rather than
  /// configured (TLS credentials); users cannot make an Impl.
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// Client of a TcpStoreServer (optionally hosting it in-process).
class BRAID_API TcpStore : public Store {
 public:
  /// Connects to `host`:`port`, retrying until `connect_timeout`, proving it knows `token`
  /// (at most 4096 bytes; what the server was given) and making the server prove it too;
  /// without a token it uses only a server that has none. With `is_server` it first starts
  /// a TcpStoreServer on that port in this process, with `token`, listening on the
  /// addresses `host` resolves to (BRAID_STORE_BIND overrides; never every interface
  /// unless told), and connects to it. With BRAID_TLS=1 the connection (and a hosted
  /// server) runs through TLS, the token's handshake inside it. Throws Error(Network) /
  /// TimeoutError (a failed TLS handshake included), and InvalidUsage when the server
  /// refuses this client or cannot prove it knows the token, when it uses TLS and this
  /// client does not, or when a BRAID_TLS_* file does not fit.
  TcpStore(const std::string& host, std::uint16_t port, bool is_server = false,
           std::chrono::milliseconds connect_timeout = std::chrono::seconds(60), const std::string& token = {});
  /// Closes the connection (and stops an owned server). Never throws.
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;  ///< See Store.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;  ///< See Store.
  std::int64_t add(const std::string& key, std::int64_t delta) override;  ///< See Store.
  bool check(const std::vector<std::string>& keys) override;  ///< See Store.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;  ///< See Store.
  bool remove(const std::string& key) override;  ///< See Store.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;  ///< See Store.

  /// Port of the server this store talks to.
  std::uint16_t port() const noexcept;

  /// Private implementation.
  struct Impl;
  /// braid's own: a client made inside the library with settings given rather than
  /// configured (TLS credentials); users cannot make an Impl.
  explicit TcpStore(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// A store kept in one file shared by every rank (a shared or network file
/// system), guarded by flock(2). Works across network namespaces and hosts that
/// mount the same path.
class BRAID_API FileStore : public Store {
 public:
  /// Opens or creates the store file at `path`.
  explicit FileStore(const std::string& path);
  /// Closes the file; the file itself stays (remove it when the job is done).
  ~FileStore() override;

  void set(const std::string& key, const std::string& value) override;  ///< See Store.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;  ///< See Store.
  std::int64_t add(const std::string& key, std::int64_t delta) override;  ///< See Store.
  bool check(const std::vector<std::string>& keys) override;  ///< See Store.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;  ///< See Store.
  bool remove(const std::string& key) override;  ///< See Store.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;  ///< See Store.

  /// Private implementation.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A view of another store with every key prefixed by `prefix` + "/". Used to give
/// each communicator (and each split) its own namespace inside one store.
class BRAID_API PrefixStore : public Store {
 public:
  /// Wraps `base`; keeps it alive.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  /// Releases the base store.
  ~PrefixStore() override;

  void set(const std::string& key, const std::string& value) override;  ///< See Store.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;  ///< See Store.
  std::int64_t add(const std::string& key, std::int64_t delta) override;  ///< See Store.
  bool check(const std::vector<std::string>& keys) override;  ///< See Store.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;  ///< See Store.
  bool remove(const std::string& key) override;  ///< See Store.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;  ///< See Store.

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace braid
