// braid transport interface.
//
// A transport moves bytes between this rank and its peers: ordered, two-sided
// send/recv of whole messages over a Connection. Everything here runs on the one
// progress thread of a communicator (the engine); nothing is thread-safe unless it
// says so. Transports know nothing of collectives, plans or the store: they name
// peers by rank and reach the bootstrap through the small PeerDirectory below.
//
// Semantics every transport provides:
// - Per connection, sends complete in the order posted and the n-th message sent by
//   A to B is matched with the n-th receive B posted for A (FIFO, no tag matching).
// - Every message carries a 64-bit tag; the receiver checks it against the tag of
//   its posted receive and fails the receive (and the connection) on a mismatch, so
//   ranks that disagree about what they are doing get an error, not wrong data.
// - A receive lands directly in the caller's buffer; the transport never buffers a
//   whole message on its own.
// - A peer that dies or closes fails every pending and later request on that
//   connection with an error string naming the peer.
#pragma once

#include "base/poller.hpp"
#include "base/tls.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace braid::transport {

/// The event loop transports register their file descriptors with (base/poller.hpp).
using base::Poller;

/// What every transport instance needs to know about its communicator; each transport's
/// options (TcpOptions, ShmOptions) add their own settings to these.
struct CommonOptions {
  int rank = 0;
  int size = 1;
  /// Shared secret every incoming connection must present in its hello.
  std::string auth_token;
  /// Identifies the communicator; a hello for another communicator is refused.
  std::uint64_t comm_id = 0;
  /// TLS credentials (BRAID_TLS); null: TLS off. The tcp transport runs every socket
  /// through TLS after its hello; the others are not made with it (core refuses them).
  std::shared_ptr<const base::tls::Context> tls;
  /// Bound on connection set-up (connect retries, finding the peer, the handshake).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  /// Told (on the progress thread) about every incoming connection that is refused
  /// because it is not an authenticated peer of this communicator; the engine logs it.
  std::function<void(const std::string&)> on_refused;
};

/// One posted send or receive. Owned by the caller, who must keep it alive (at a
/// stable address) until it is no longer pending. Completed by the transport.
struct Request {
  enum class State : std::uint8_t { idle, pending, done, failed };
  State state = State::idle;
  /// Set when state == failed: what happened, naming the peer.
  std::string error;
  /// Rank blamed for the failure (usually the connection's peer), -1 if none.
  int failed_peer = -1;
  /// True when the failure was a closed/reset connection (as opposed to bad data).
  bool peer_closed = false;
  /// True when the peer said why before it closed (Transport::tell_peers): `error` ends
  /// with its words and `failed_peer` is the rank it blamed (or the peer itself).
  bool peer_told = false;
};

/// What a failing rank tells the peers it is connected to before it closes (bounded).
constexpr std::size_t kMaxNoticeBytes = 1024;

/// An ordered, bidirectional message channel to one peer.
class Connection {
 public:
  virtual ~Connection() = default;
  /// The peer's rank.
  virtual int peer() const noexcept = 0;
  /// Queues a send of `bytes` from `buf` (may be 0 bytes). `req` becomes pending,
  /// then done once the data has left `buf` (buf may be reused), or failed.
  virtual void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) = 0;
  /// Queues a receive of exactly `bytes` into `buf`. The message must carry `tag`
  /// and exactly `bytes` bytes, or `req` fails with a message saying what arrived.
  virtual void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) = 0;
  /// True once the connection has failed or the peer has closed it, even with no
  /// request pending; `why` (if given) receives the reason naming the peer.
  virtual bool broken(std::string* why) const = 0;

  /// Whether send_device/recv_device may be called: this connection moves device memory
  /// itself (UCX built with CUDA: cuda_copy, cuda_ipc, GPUDirect RDMA). The engine's
  /// direct device path then hands it device buffers; other connections get pinned host
  /// slots (core::DeviceExec).
  virtual bool takes_device_memory() const noexcept { return false; }
  /// As send() and recv(), with `buf` in the communicator's GPU memory. Only where
  /// takes_device_memory(); the default refuses.
  virtual void send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req);
  virtual void recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req);
};

/// Bootstrap services a transport needs, implemented by the engine over the store.
class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  /// Publishes a value other ranks can look up under (this rank, key).
  virtual void publish(const std::string& key, const std::string& value) = 0;
  /// Looks up what `peer` published under `key`, waiting up to `timeout`.
  /// Throws braid::Error on timeout.
  virtual std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Same without waiting: empty when `peer` has not published `key` yet. Throws
  /// braid::Error when the directory itself fails.
  virtual std::optional<std::string> try_lookup(int peer, const std::string& key) = 0;
  /// Why `peer` will never publish anything more, when the job knows: it failed (its own
  /// report), another rank found it dead, or it closed its communicator; empty otherwise.
  /// For a transport that waits for a peer's record (ibverbs) where a socket transport's
  /// connect would be refused. Costs a few store round trips: ask at most a few times a
  /// second. Never throws.
  virtual std::optional<std::string> peer_gone(int /*peer*/) { return std::nullopt; }
};

/// A transport instance of one communicator.
class Transport {
 public:
  virtual ~Transport() = default;
  /// Short name ("tcp", "shm", ...).
  virtual const char* name() const noexcept = 0;
  /// The connection to `peer`, set up on first use (lazily). Never returns null;
  /// set-up failures surface as failed requests. The pointer stays valid for the
  /// transport's lifetime.
  virtual Connection* connection(int peer) = 0;
  /// Moves data on every connection without blocking. Returns true if anything
  /// progressed (so that the engine keeps spinning while there is work).
  virtual bool progress() = 0;
  /// Fails every pending request with `reason` and closes every connection.
  /// Called on abort and shutdown. Idempotent.
  virtual void close_all(const std::string& reason) = 0;
  /// Before close_all on a failure: tells every peer with an established connection why,
  /// and whom this rank blames (-1: none), so that each can report it without the store
  /// (docs/reliability.md, "Failure handling"). Best effort and never blocking: a peer whose
  /// connection cannot take the notice at once (mid-message, or full) sees only the close.
  virtual void tell_peers(int /*blame*/, const std::string& /*reason*/) {}
  /// Called by the engine right before it blocks in Poller::wait. A transport whose
  /// peers signal it without file descriptors (shared memory) arms its wake-ups here
  /// and returns false if work arrived meanwhile, in which case the engine does not
  /// block. Socket transports need nothing: their fds are in the poller.
  virtual bool prepare_sleep() { return true; }
  /// True when the wake-up prepare_sleep() armed has been used up by progress() since
  /// (UCX: a worker must be armed again after it is progressed). A thread that drove
  /// progress while the engine thread slept then wakes the engine thread to arm again.
  virtual bool needs_rearm() const { return false; }
  /// False for a transport that only the engine thread should drive: once a pair runs over
  /// it, the communicator runs no call inline and no waiter helps (ucx: UCX's wake-ups are
  /// missed when another thread progresses the worker between the engine's arm and its
  /// sleep; docs/transport-ucx.md).
  virtual bool helpers_welcome() const { return true; }
};

}  // namespace braid::transport
