// braid shared-memory transport.
//
// Protocol (layouts in shm/shm_wire.hpp, prose in docs/transport-shm.md):
// - Each rank listens on a Unix stream socket in the abstract namespace,
//   "braid-shm-<comm_id hex>-<rank>-<pid>", and publishes that name under key "shm".
// - For a pair (lo, hi), lo connects (lazily, on its first connection(hi)): it looks
//   hi's name up without blocking, connects, creates the pair's segment
//   <segment_dir>/braid-<comm_id hex>-<lo>-<hi> with O_EXCL, sizes it with
//   posix_fallocate (so a full /dev/shm is an error now, not a SIGBUS later), maps
//   it, unlinks it, and sends a Hello {comm id, ranks, slots, slot_bytes, a proof of the token}
//   with the segment's fd attached (SCM_RIGHTS). The name thus lives only
//   for the few system calls of the set-up: nothing is left in /dev/shm whatever
//   happens later. hi checks the hello (strangers are closed silently), checks and
//   maps the segment, and answers an Ack; from then on the socket carries
//   doorbells only.
// - The segment holds one SPSC ring per direction: `slots` slots of `slot_bytes`
//   with a 64-byte header each, head/tail counters and two flags on separate lines.
//   A message is cut into slot-sized parts, each slot carrying {seq, tag, message
//   bytes, offset, part bytes}. The receiver copies a part straight into the posted
//   buffer, so a message is copied twice (in and out) and never buffered whole. (A
//   single-copy path with process_vm_readv was measured slower than the pipelined
//   two copies on the development machine and left out; see the docs.)
// - The fast path is atomics and memcpy, no system calls. The socket is the
//   doorbell: a side about to block (prepare_sleep) sets "consumer sleeping" on its
//   incoming ring (when it waits for data) and "producer waiting" on its outgoing
//   ring (when it waits for slots), then re-checks the rings; the other side
//   rings (writes one byte) when it publishes or releases a slot and finds the
//   flag set (Dekker-style with seq_cst fences, so no wake-up is lost; the flag is
//   swapped to 0 so one sleep costs at most one byte).
// - The socket is also the liveness check: EOF or reset means the peer is gone.
//   Messages already in the ring can still be received; anything else pending fails
//   with "shm connection to rank N ... closed by peer" (peer_closed = true).
//
// - GPU buffers (ShmOptions::gpu: the communicator has a GPU; the engine's direct device
//   path calls send_device/recv_device). Where both ranks of a pair have a GPU, lo also
//   allocates a device ring (2 x slots x slot_bytes of its GPU's memory), exports it with
//   gpu::Runtime::ipc_export into the segment header, and hi maps it (ipc_open: CUDA IPC;
//   threads of one process use lo's pointer) and sets kAckDeviceRing in its Ack. A part of
//   a device message is then copied GPU to GPU into the device slot of its index (NVLink
//   or PCIe peer to peer), its header published in the host ring as for any part (kind
//   kKindDevice), and the receiver copies it out of the device slot into its buffer. The
//   copies go on the connection's copy stream, each followed by a host function that
//   counts it done (an asynchronous copy-engine proxy, NCCL's CE proxy shape): the sender
//   publishes a part's header, and the receiver releases its slot, in ring order once the
//   stream has run its copy; the progress thread never waits on one. Without a device
//   ring, a device message goes through the host ring, copied there and out the same way. A failed connection keeps
//   its ring until the transport is destroyed; then hi unmaps it, and lo's is freed once
//   no thread of its process uses it (threads share it by pointer, counted in
//   local_rings()). Across processes lo frees it at its own teardown: on the emulated
//   runtime hi's mapping keeps the pages; on CUDA a message lo sent just before it was
//   destroyed must have been received by then (docs/transport-shm.md).
//
// The listener, accepted sockets waiting for their hello, the hello's authentication,
// the peer-address lookup and the set-up deadlines are the Skeleton's
// (transport/skeleton.hpp), shared with the other socket-set-up transport.
#include "transport/shm/shm_transport.hpp"

#include "base/fd.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "gpu/runtime.hpp"
#include "transport/common.hpp"
#include "transport/skeleton.hpp"
#include "transport/shm/shm_wire.hpp"

#include <braid/error.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace braid::transport {

namespace {

namespace wire = shm_wire;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;


using base::hex16;

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

using base::UniqueFd;

/// An owned shared mapping.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, std::size_t bytes) : base_(static_cast<unsigned char*>(base)), bytes_(bytes) {}
  ~Mapping() { reset(); }
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  unsigned char* get() const noexcept { return base_; }
  void reset() noexcept {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

 private:
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
};

/// One direction of a pair, as seen in this process's mapping.
struct RingView {
  wire::RingControl* ctl = nullptr;
  wire::SlotHeader* headers = nullptr;
  unsigned char* payload = nullptr;
};

// ThreadSanitizer and the device ring of ranks that are threads of one process: both use
// lo's ring at one address, but the counters that order their accesses (head, tail) sit in
// the segment, which each rank maps at an address of its own, so TSan sees the slot's
// accesses and not what orders them. Each side tells it, on the slot: acquire before its
// access, release after (the counters' release/acquire do the real work).
#if defined(__SANITIZE_THREAD__)
#define BRAID_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BRAID_TSAN 1
#endif
#endif
#ifdef BRAID_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void slot_acquired(const void* slot) { __tsan_acquire(const_cast<void*>(slot)); }
void slot_released(const void* slot) { __tsan_release(const_cast<void*>(slot)); }
#else
void slot_acquired(const void*) {}
void slot_released(const void*) {}
#endif

/// Parts of this process's connections waiting behind copies on their streams (tests).
std::atomic<long> g_pending{0};

void count_copy_done(void* counter) noexcept {
  static_cast<std::atomic<std::uint64_t>*>(counter)->fetch_add(1, std::memory_order_release);
}


/// The device rings this process allocated, with how many transports use each: ranks that
/// are threads of one process share lo's ring by pointer (CUDA cannot open a handle in the
/// process that made it), and it is freed when the last of them lets go, so that a lo
/// destroyed first never leaves hi copying out of freed memory. hi takes a pointer only if
/// it is listed here.
struct LocalRings {
  std::mutex mu;
  std::unordered_map<const void*, int> users;
};
LocalRings& local_rings() {
  static LocalRings* r = new LocalRings;  // never destroyed: transports may outlive statics
  return *r;
}
bool share_local_ring(const void* p) {
  LocalRings& r = local_rings();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.users.find(p);
  if (it == r.users.end()) return false;
  ++it->second;
  return true;
}
/// One user fewer; true when it was the last (the caller frees the ring).
bool release_local_ring(const void* p) {
  LocalRings& r = local_rings();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.users.find(p);
  if (it == r.users.end() || --it->second > 0) return false;
  r.users.erase(it);
  return true;
}

RingView ring_view(unsigned char* base, const wire::Layout& l, int ring) {
  unsigned char* r = base + l.ring_offset(ring);
  RingView v;
  v.ctl = reinterpret_cast<wire::RingControl*>(r);
  v.headers = reinterpret_cast<wire::SlotHeader*>(r + l.headers_offset);
  v.payload = r + l.payload_offset;
  return v;
}

/// A part waiting to be published (send) or released (receive) in ring order: behind its
/// own device copy on the connection's copy stream (`copy` > 0: done once the stream's
/// completion count reaches it), or behind such a part (`copy` 0, a host part).
struct PendingPart {
  std::uint64_t copy = 0;                ///< the copy's number on the copy stream; 0: none
  std::uint64_t msg = 0;                 ///< the message's sequence number
  const unsigned char* slot = nullptr;   ///< for the TSan annotations
  wire::SlotHeader header{};             ///< send: what to publish
};

struct SendOp {
  Request* req = nullptr;
  const unsigned char* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;
  std::uint64_t seq = 0;
  std::size_t posted = 0;  // payload bytes put into slots
  bool all_posted = false;
  bool device = false;  // data is GPU memory (send_device)
};

struct RecvOp {
  Request* req = nullptr;
  unsigned char* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;
  std::uint64_t seq = 0;
  std::size_t got = 0;
  bool started = false;  // a part matched
  bool device = false;   // data is GPU memory (recv_device)
};

class ShmTransport;

class ShmConnection final : public Connection {
 public:
  enum class Setup : std::uint8_t { idle, wanted, lookup, await_ack, up };

  ShmConnection(ShmTransport& t, int peer, int my_rank) : t_(t), peer_(peer), connector_(my_rank < peer) {}

  int peer() const noexcept override { return peer_; }
  void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  bool takes_device_memory() const noexcept override;
  void send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void post_send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device);
  void post_recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device);
  bool broken(std::string* why) const override {
    if (failure_.failed) {
      if (why) *why = failure_.error;
      return true;
    }
    // A peer that closed after publishing messages is not broken until they are
    // read: they are in our mapping, and a receive can still take them.
    if (eof_ && in_pending_.empty() &&
        (in_.ctl == nullptr || in_.ctl->head.load(std::memory_order_acquire) == in_taken_)) {
      if (why) *why = who() + " closed by peer" + failure_.told_words();
      return true;
    }
    return false;
  }

  /// "shm connection to rank 3 (pid 1234)" for error messages.
  std::string who() const {
    std::string s = "shm connection to rank " + std::to_string(peer_);
    if (peer_pid_ > 0) s += " (pid " + std::to_string(peer_pid_) + ")";
    return s;
  }

  ShmTransport& t_;
  const int peer_;
  const bool connector_;  // this rank connects and creates the segment
  Setup setup_ = Setup::idle;
  int fd_ = -1;
  bool readable_ = false;
  pid_t peer_pid_ = 0;
  Mapping map_;
  RingView out_, in_;
  // The device ring (both ranks with a GPU): this direction's device slots and the other's;
  // lo owns the allocation, hi maps it (null: device messages go through the host ring).
  unsigned char* dev_out_ = nullptr;
  unsigned char* dev_in_ = nullptr;
  void* dev_owned_ = nullptr;   // lo: gpu::Runtime::alloc_device (in local_rings())
  void* dev_shared_ = nullptr;  // hi, a thread of lo's process: lo's ring (in local_rings())
  void* dev_opened_ = nullptr;  // hi, another process: gpu::Runtime::ipc_open, closed with the transport

  std::vector<unsigned char> hs_;  // handshake bytes being read
  std::size_t hs_got_ = 0;
  Clock::time_point deadline_{};
  PeerLookup lookup_;  // finding the peer's doorbell socket

  Fifo<SendOp> sends_;
  std::size_t post_idx_ = 0;  // sends_[post_idx_] is the first not fully in slots
  std::uint64_t send_seq_ = 0;
  Fifo<RecvOp> recvs_;
  std::size_t recv_idx_ = 0;  // recvs_[recv_idx_] is the first not fully taken from slots
  std::uint64_t recv_seq_ = 0;
  std::uint64_t out_head_ = 0, out_tail_ = 0;  // published; last tail seen
  std::uint64_t out_claimed_ = 0;              // slots filled or being filled (>= out_head_)
  std::uint64_t in_tail_ = 0, in_head_ = 0;    // released; last head seen
  std::uint64_t in_taken_ = 0;                 // slots whose part is taken or being copied out (>= in_tail_)

  // The asynchronous copy-engine proxy (NCCL's CE proxy shape): device parts are copied on
  // this stream, and the progress thread publishes or releases their slots, in ring order,
  // once the stream has counted them done. It never waits on a copy.
  gpu::Stream copy_stream_ = nullptr;
  std::uint64_t copies_issued_ = 0;
  std::atomic<std::uint64_t> copies_done_{0};  // written by a host function on copy_stream_
  Fifo<PendingPart> out_pending_, in_pending_;
  bool armed_in_ = false, armed_out_ = false;

  Failure failure_;
  bool eof_ = false;  // the peer's socket reached EOF
  std::string notice_;  // a failure notice being read from the doorbell socket (wire::kNotice...)
};

sockaddr_un abstract_addr(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

bool valid_socket_name(const std::string& s) {
  if (s.size() < 10 || s.size() > 100 || s.compare(0, 10, "braid-shm-") != 0) return false;
  for (char ch : s) {
    if (ch < 0x21 || ch > 0x7e) return false;
  }
  return true;
}

/// The credentials of the process at the other end of `fd` (the kernel's word,
/// SO_PEERCRED); pid 0 and uid -1 when it does not say.
ucred peer_cred(int fd) {
  const ucred unknown{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
  ucred cred = unknown;
  socklen_t len = sizeof cred;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred : unknown;
}

pid_t peer_pid(int fd) { return peer_cred(fd).pid; }

/// Whether the process at the other end of `fd` runs as this process's user: the abstract
/// socket's name is visible to every user of the host (/proc/net/unix), and only the
/// job's own processes may connect.
bool same_user(int fd) { return peer_cred(fd).uid == ::geteuid(); }

/// Writes all of `bytes` (a short handshake message) at once, with `pass_fd`
/// attached when >= 0. A fresh Unix socket always has room for it; anything short
/// is reported as an error.
bool send_handshake(int fd, const std::string& bytes, int pass_fd, int* err) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
  }
  for (;;) {
    const ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r == static_cast<ssize_t>(bytes.size())) return true;
    *err = r < 0 ? errno : EAGAIN;
    return false;
  }
}



class ShmTransport final : public Skeleton {
 public:
  ShmTransport(const ShmOptions& options, Poller& poller, PeerDirectory& directory);
  ~ShmTransport() override;

  const char* name() const noexcept override { return "shm"; }
  Connection* connection(int peer) override;
  gpu::Runtime* gpu() const noexcept { return opts_.gpu; }
  bool prepare_sleep() override;

  /// Fails every pending request of `c` with `msg`, closes its socket and unmaps its
  /// segment; later requests fail with the same message.
  void fail(ShmConnection& c, const std::string& msg, bool closed, int blame);

 private:
  ShmConnection& get_conn(int peer);
  void close_socket(ShmConnection& c) noexcept;
  void watch_conn(ShmConnection& c);
  void cleanup_names() noexcept;
  void ring_bell(ShmConnection& c) noexcept;
  void tell_peers(int blame, const std::string& reason) override;
  /// Takes the doorbell socket's bytes: bells, or a peer's notice (kept in c.failure_).
  bool take_socket_bytes(ShmConnection& c, const unsigned char* p, std::size_t n);
  void bell_if_flagged(ShmConnection& c, std::atomic<std::uint32_t>& flag) noexcept;

  bool progress_connection(ShmConnection& c);
  bool service_socket(ShmConnection& c);
  bool progress_send(ShmConnection& c);
  bool progress_recv(ShmConnection& c);
  bool check_slot(ShmConnection& c, const RecvOp& op, const wire::SlotHeader& h);
  void on_eof(ShmConnection& c);
  void protocol_error(ShmConnection& c, const std::string& what);

  void start_connect(ShmConnection& c);
  bool create_segment(ShmConnection& c, UniqueFd* fd, std::string* error);
  void attach(ShmConnection& c, Mapping map);
  /// lo: allocates and exports the pair's device ring into *sh (nothing when this rank or
  /// the settings have no GPU, or the runtime cannot; said at INFO).
  void make_device_ring(ShmConnection& c, wire::SegmentHeader* sh);
  /// hi: maps the device ring lo described; true when it did.
  bool open_device_ring(ShmConnection& c, const wire::SegmentHeader& sh);
  /// Lets go of the pair's device ring (frees lo's when no thread of this process uses it).
  void release_device_ring(ShmConnection& c) noexcept;
  /// Enqueues a part's copy on the connection's copy stream (device memory at either
  /// end), then a host function that counts it done; returns its number (> 0), or 0 with
  /// the connection failed when the runtime refuses.
  std::uint64_t device_copy_async(ShmConnection& c, void* dst, const void* src, std::size_t n);
  /// Waits for the connection's copies (local work, bounded: none waits on the peer) and
  /// forgets its pending parts: before its mappings or the device ring go away.
  void finish_copies(ShmConnection& c) noexcept;
  /// Publishes the parts whose copies have run (in ring order) and completes the sends
  /// whose parts are all published; true when anything moved.
  bool publish_copied(ShmConnection& c);
  /// Destroys the connection's copy stream (after finish_copies). Never throws.
  void destroy_copy_stream(ShmConnection& c) noexcept;
  /// Writes a slot's header and advances the published head.
  void publish(ShmConnection& c, std::size_t idx, const wire::SlotHeader& h);
  void on_ack(ShmConnection& c, const wire::Ack& a, const std::string& reason);

  // Skeleton.
  bool adopt(PendingAccept& pa) override;
  std::string refusal(const PendingAccept& pa, bool valid) const override;
  bool progress_connections() override;
  Clock::time_point connection_deadlines(Clock::time_point now) override;
  void fail_connections(const std::string& reason) override;
  void after_close() noexcept override { cleanup_names(); }

  ShmOptions opts_;
  wire::Layout layout_;
  std::string socket_name_;
  bool names_cleaned_ = false;
  ConnectionTable<ShmConnection> conns_;
};

// ---------------------------------------------------------------------------
// Posting.

void ShmConnection::send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post_send(buf, bytes, tag, req, false);
}

void ShmConnection::recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post_recv(buf, bytes, tag, req, false);
}

bool ShmConnection::takes_device_memory() const noexcept { return t_.gpu() != nullptr; }

void ShmConnection::send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::send_device(buf, bytes, tag, req);
  post_send(buf, bytes, tag, req, true);
}

void ShmConnection::recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::recv_device(buf, bytes, tag, req);
  post_recv(buf, bytes, tag, req, true);
}

void ShmConnection::post_send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device) {
  check_post("shm", "send", buf, bytes, req, peer_);
  start_request(req);
  if (!failure_.failed && eof_) t_.fail(*this, who() + " closed by peer", true, peer_);
  if (failure_.failed) {
    failure_.apply(req);
    return;
  }
  SendOp op;
  op.req = req;
  op.data = static_cast<const unsigned char*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  op.seq = send_seq_++;
  op.device = device;
  sends_.push_back(op);
}

void ShmConnection::post_recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device) {
  check_post("shm", "recv", buf, bytes, req, peer_);
  start_request(req);
  if (failure_.failed) {
    failure_.apply(req);
    return;
  }
  // After EOF a receive can still complete from what the peer left in the ring;
  // progress() fails it otherwise.
  RecvOp op;
  op.req = req;
  op.data = static_cast<unsigned char*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  op.seq = recv_seq_++;
  op.device = device;
  recvs_.push_back(op);
}

// ---------------------------------------------------------------------------
// Set-up and teardown.

ShmTransport::ShmTransport(const ShmOptions& options, Poller& poller, PeerDirectory& directory)
    : Skeleton(options, poller, directory, "shm", {wire::kHelloMagic, wire::kHelloBytes, &wire::hello_tail}),
      opts_(options),
      layout_(wire::layout(options.slot_bytes, static_cast<std::size_t>(options.slots))),
      conns_(options.size) {
  socket_name_ = "braid-shm-" + hex16(opts_.comm_id) + "-" + std::to_string(opts_.rank) + "-" +
                 std::to_string(::getpid());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw Error(ErrorCode::System, self() + ": socket(AF_UNIX) failed: " + errno_text(errno));
  socklen_t len = 0;
  const sockaddr_un a = abstract_addr(socket_name_, &len);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
    throw Error(ErrorCode::System, self() + ": cannot listen on the abstract Unix socket @" + socket_name_ + ": " +
                                       errno_text(errno) + "; set BRAID_TRANSPORT=tcp to avoid shared memory");
  }
  serve(std::move(fd));
  directory_.publish("shm", socket_name_);
}

ShmTransport::~ShmTransport() {
  // Requests may already be gone; only fds, mappings and names are released here
  // (close_all fails pending requests and is what an orderly shutdown calls first).
  for (ShmConnection* c : conns_.all()) {
    close_socket(*c);
    finish_copies(*c);
    destroy_copy_stream(*c);
    c->map_.reset();
    release_device_ring(*c);
  }
  cleanup_names();
}

void ShmTransport::close_socket(ShmConnection& c) noexcept {
  if (c.fd_ >= 0) {
    poller_.unwatch(c.fd_);
    ::close(c.fd_);
    c.fd_ = -1;
  }
  c.readable_ = false;
}

void ShmTransport::watch_conn(ShmConnection& c) {
  poller_.watch(c.fd_, EPOLLIN | EPOLLRDHUP | EPOLLET, [p = &c](std::uint32_t) { p->readable_ = true; });
}

/// Safety net: a rank killed between creating a segment and unlinking it (a few
/// system calls) leaves a name behind; whoever of the pair closes later removes it.
void ShmTransport::cleanup_names() noexcept {
  if (names_cleaned_) return;
  names_cleaned_ = true;
  DIR* d = ::opendir(opts_.segment_dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = "braid-" + hex16(opts_.comm_id) + "-";
  while (dirent* e = ::readdir(d)) {
    const char* n = e->d_name;
    if (std::strncmp(n, prefix.c_str(), prefix.size()) != 0) continue;
    int a = -1, b = -1;
    char tail = 0;
    if (std::sscanf(n + prefix.size(), "%d-%d%c", &a, &b, &tail) != 2) continue;
    if (a == opts_.rank || b == opts_.rank) ::unlinkat(::dirfd(d), n, 0);
  }
  ::closedir(d);
}

ShmConnection& ShmTransport::get_conn(int peer) {
  bool fresh = false;
  ShmConnection& c =
      conns_.get(peer, [&] { return std::make_unique<ShmConnection>(*this, peer, opts_.rank); }, &fresh);
  if (fresh && closed()) c.failure_.set(closed_reason(), false, -1);
  return c;
}

Connection* ShmTransport::connection(int peer) {
  check_peer(peer);
  ShmConnection& c = get_conn(peer);
  if (c.connector_ && c.setup_ == ShmConnection::Setup::idle && !c.failure_.failed) {
    c.setup_ = ShmConnection::Setup::wanted;  // connect on the next progress()
  }
  return &c;
}

void ShmTransport::fail(ShmConnection& c, const std::string& msg, bool closed, int blame) {
  if (!c.failure_.set(msg, closed, blame)) return;
  close_socket(c);
  finish_copies(c);  // a copy still running may write the mapping or the caller's buffer
  destroy_copy_stream(c);
  c.map_.reset();
  c.out_ = c.in_ = RingView{};
  c.dev_out_ = c.dev_in_ = nullptr;  // the ring itself stays until the transport goes (see the top)
  c.failure_.apply_all(c.sends_);
  c.failure_.apply_all(c.recvs_);
  c.post_idx_ = c.recv_idx_ = 0;
  c.armed_in_ = c.armed_out_ = false;
  c.hs_.clear();
  changed();
}

void ShmTransport::fail_connections(const std::string& reason) {
  for (ShmConnection* c : conns_.all()) fail(*c, reason, false, -1);
}

void ShmTransport::protocol_error(ShmConnection& c, const std::string& what) {
  fail(c, c.who() + ": protocol error: " + what, false, c.peer_);
}

// ---------------------------------------------------------------------------
// Doorbells.

void ShmTransport::ring_bell(ShmConnection& c) noexcept {
  if (c.fd_ < 0) return;
  // EAGAIN: the peer has unread bells, which is as good. EPIPE/ECONNRESET: the peer
  // is gone, which the read side reports.
  const ssize_t r = ::send(c.fd_, &wire::kBell, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)r;
}

void ShmTransport::bell_if_flagged(ShmConnection& c, std::atomic<std::uint32_t>& flag) noexcept {
  // Pairs with the fence in prepare_sleep(): either the sleeper sees what we just
  // published, or we see its flag.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (flag.load(std::memory_order_relaxed) != 0 && flag.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
}

bool ShmTransport::prepare_sleep() {
  if (closed()) return true;
  if (setup_waiting()) return false;  // let progress() deal with it first
  bool ready = false;
  const std::uint64_t slots = layout_.slots;
  for (ShmConnection* c : conns_.all()) {
    if (c->failure_.failed) continue;
    if (c->readable_) ready = true;
    // Copies on the copy stream: no wake-up comes when they finish, and they take
    // microseconds (a slot each, local): poll until they have (after EOF too).
    if (!c->out_pending_.empty() || !c->in_pending_.empty()) ready = true;
    if (c->setup_ != ShmConnection::Setup::up || c->eof_) continue;
    if (c->recv_idx_ < c->recvs_.size()) {
      c->in_.ctl->consumer_sleeping.store(1, std::memory_order_relaxed);
      c->armed_in_ = true;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (c->in_.ctl->head.load(std::memory_order_acquire) != c->in_taken_) ready = true;
    }
    if (c->post_idx_ < c->sends_.size()) {
      c->out_.ctl->producer_waiting.store(1, std::memory_order_relaxed);
      c->armed_out_ = true;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (c->out_claimed_ - c->out_.ctl->tail.load(std::memory_order_acquire) < slots) ready = true;
    }
  }
  return !ready;
}

// ---------------------------------------------------------------------------
// Progress.

bool ShmTransport::progress_connections() {
  return conns_.step_all([this](ShmConnection& c) { return progress_connection(c); });
}

bool ShmTransport::progress_connection(ShmConnection& c) {
  if (c.failure_.failed) return false;
  if (c.armed_in_) {
    c.in_.ctl->consumer_sleeping.store(0, std::memory_order_relaxed);
    c.armed_in_ = false;
  }
  if (c.armed_out_) {
    c.out_.ctl->producer_waiting.store(0, std::memory_order_relaxed);
    c.armed_out_ = false;
  }
  if (c.setup_ == ShmConnection::Setup::wanted) start_connect(c);
  bool moved = false;
  if (c.fd_ >= 0 && c.readable_) moved |= service_socket(c);
  if (c.failure_.failed || c.setup_ != ShmConnection::Setup::up) return moved;
  moved |= progress_recv(c);
  if (!c.failure_.failed && !c.eof_) moved |= progress_send(c);
  // After EOF nothing new is sent, but parts whose copy was running are published (the
  // peer is gone; a send completes once its data is in the ring, as before EOF).
  if (!c.failure_.failed && c.eof_ && !c.out_pending_.empty()) moved |= publish_copied(c);
  if (!c.failure_.failed && c.eof_ && (!c.recvs_.empty() || !c.sends_.empty()) && c.in_pending_.empty() &&
      c.out_pending_.empty()) {  // parts being copied complete first
    const bool midway = !c.recvs_.empty() && c.recvs_.front().started;
    fail(c, c.who() + " closed by peer" + (midway ? " in the middle of a message" : ""), true, c.peer_);
    moved = true;
  }
  return moved;
}

bool ShmTransport::progress_send(ShmConnection& c) {
  const std::uint64_t slots = layout_.slots;
  const std::size_t slot_bytes = layout_.slot_bytes;
  bool moved = false, published = false;
  std::size_t budget = layout_.slots;  // slots per call: one large message cannot starve the rest
  while (c.post_idx_ < c.sends_.size() && budget > 0) {
    SendOp& op = c.sends_[c.post_idx_];
    if (c.out_claimed_ - c.out_tail_ >= slots) {
      const std::uint64_t t = c.out_.ctl->tail.load(std::memory_order_acquire);
      if (t > c.out_head_ || t < c.out_tail_) {
        protocol_error(c, "the peer's release counter moved to " + std::to_string(t) + " (published " +
                              std::to_string(c.out_head_) + "): shared ring corrupted");
        return true;
      }
      c.out_tail_ = t;
      if (c.out_claimed_ - c.out_tail_ >= slots) break;
    }
    const std::size_t idx = static_cast<std::size_t>(c.out_claimed_ % slots);
    const std::size_t part = std::min(slot_bytes, op.bytes - op.posted);
    // A device message goes GPU to GPU where there is a device ring, else through the host
    // ring; either way the copy stream copies it (the CPU cannot read GPU memory), and the
    // slot is published once the stream has run the copy.
    const bool in_device_slot = op.device && c.dev_out_ != nullptr;
    PendingPart pp;
    pp.msg = op.seq;
    pp.slot = in_device_slot ? c.dev_out_ + idx * slot_bytes : c.out_.payload + idx * slot_bytes;
    if (part > 0 && op.device) {
      slot_acquired(pp.slot);
      pp.copy = device_copy_async(c, const_cast<unsigned char*>(pp.slot), op.data + op.posted, part);
      if (pp.copy == 0) return true;
    } else if (part > 0) {
      std::memcpy(c.out_.payload + idx * slot_bytes, op.data + op.posted, part);
    }
    wire::SlotHeader& h = pp.header;
    h.seq = op.seq;
    h.tag = op.tag;
    h.msg_bytes = op.bytes;
    h.offset = op.posted;
    h.part_bytes = part;
    h.kind = in_device_slot ? wire::kKindDevice : wire::kKindInline;
    ++c.out_claimed_;
    if (pp.copy == 0 && c.out_pending_.empty()) {
      publish(c, idx, h);
      published = true;
    } else {
      c.out_pending_.push_back(pp);
      g_pending.fetch_add(1, std::memory_order_relaxed);
    }
    op.posted += part;
    moved = true;
    --budget;
    if (op.posted == op.bytes) {
      op.all_posted = true;
      ++c.post_idx_;
    }
  }
  if (published) {
    moved = true;
    bell_if_flagged(c, c.out_.ctl->consumer_sleeping);
  }
  return publish_copied(c) || moved;
}

bool ShmTransport::publish_copied(ShmConnection& c) {
  const std::uint64_t slots = layout_.slots;
  bool moved = false;
  // Parts behind a copy: published in ring order once the copy stream has run theirs.
  const std::uint64_t done = c.copies_done_.load(std::memory_order_acquire);
  while (!c.out_pending_.empty() && c.out_pending_.front().copy <= done) {
    const PendingPart& pp = c.out_pending_.front();
    if (pp.copy != 0) slot_released(pp.slot);
    publish(c, static_cast<std::size_t>(c.out_head_ % slots), pp.header);
    c.out_pending_.pop_front();
    g_pending.fetch_sub(1, std::memory_order_relaxed);
    moved = true;
  }
  if (moved) bell_if_flagged(c, c.out_.ctl->consumer_sleeping);
  // Sends complete in posted order, once their last part is published: the data has
  // left the caller's buffer.
  while (!c.sends_.empty()) {
    SendOp& f = c.sends_.front();
    if (!f.all_posted || (!c.out_pending_.empty() && c.out_pending_.front().msg == f.seq)) break;
    f.req->state = Request::State::done;
    c.sends_.pop_front();
    --c.post_idx_;
    moved = true;
  }
  return moved;
}

void ShmTransport::publish(ShmConnection& c, std::size_t idx, const wire::SlotHeader& h) {
  std::memcpy(&c.out_.headers[idx], &h, sizeof h);
  c.out_.ctl->head.store(++c.out_head_, std::memory_order_release);
}

bool ShmTransport::check_slot(ShmConnection& c, const RecvOp& op, const wire::SlotHeader& h) {
  const wire::SlotMatch m = wire::match_slot(h, op.seq, op.tag, op.bytes, op.got, layout_.slot_bytes);
  if (m == wire::SlotMatch::wrong_message) {
    protocol_error(c, "expected message #" + std::to_string(op.seq) + ", got message #" + std::to_string(h.seq));
    return false;
  }
  if (m == wire::SlotMatch::mismatch) {
    if (!op.started) {
      fail(c, "message #" + std::to_string(op.seq) + " from rank " + std::to_string(c.peer_) +
                  " does not match the posted receive: expected tag " + std::to_string(op.tag) + " and " +
                  std::to_string(op.bytes) + " bytes, got tag " + std::to_string(h.tag) + " and " +
                  std::to_string(h.msg_bytes) + " bytes (" + c.who() +
                  "); the ranks disagree about the operation they are running",
           false, c.peer_);
    } else {
      protocol_error(c, "a part of message #" + std::to_string(op.seq) + " carries tag " + std::to_string(h.tag) +
                            " and size " + std::to_string(h.msg_bytes) + ", but its first part carried tag " +
                            std::to_string(op.tag) + " and size " + std::to_string(op.bytes));
    }
    return false;
  }
  if (m == wire::SlotMatch::unknown_kind) {
    protocol_error(c, "slot of unknown kind " + std::to_string(h.kind) + " for message #" + std::to_string(op.seq));
    return false;
  }
  if (m == wire::SlotMatch::wrong_range) {
    const std::size_t want = std::min(layout_.slot_bytes, op.bytes - op.got);
    protocol_error(c, "part of message #" + std::to_string(op.seq) + " (" + std::to_string(op.bytes) +
                          " bytes) at offset " + std::to_string(h.offset) + " with " + std::to_string(h.part_bytes) +
                          " bytes, expected offset " + std::to_string(op.got) + " with " + std::to_string(want));
    return false;
  }
  return true;
}

bool ShmTransport::progress_recv(ShmConnection& c) {
  const std::uint64_t slots = layout_.slots;
  const std::size_t slot_bytes = layout_.slot_bytes;
  bool moved = false, released = false;
  std::size_t budget = layout_.slots;
  while (c.recv_idx_ < c.recvs_.size() && budget > 0) {
    RecvOp& op = c.recvs_[c.recv_idx_];
    if (c.in_taken_ == c.in_head_) {
      const std::uint64_t h = c.in_.ctl->head.load(std::memory_order_acquire);
      if (h - c.in_tail_ > slots || h < c.in_taken_) {
        protocol_error(c, "the peer's publish counter moved to " + std::to_string(h) + " (released " +
                              std::to_string(c.in_tail_) + "): shared ring corrupted");
        return true;
      }
      c.in_head_ = h;
      if (h == c.in_taken_) break;
    }
    const std::size_t idx = static_cast<std::size_t>(c.in_taken_ % slots);
    wire::SlotHeader h;
    std::memcpy(&h, &c.in_.headers[idx], sizeof h);  // one snapshot, validated before use
    if (!check_slot(c, op, h)) return true;
    if (h.kind == wire::kKindDevice && c.dev_in_ == nullptr) {
      protocol_error(c, "a part of message #" + std::to_string(op.seq) + " in a device slot, but this pair has no device ring");
      return true;
    }
    PendingPart pp;
    pp.msg = op.seq;
    pp.slot = h.kind == wire::kKindDevice ? c.dev_in_ + idx * slot_bytes : c.in_.payload + idx * slot_bytes;
    if (h.part_bytes > 0 && (h.kind == wire::kKindDevice || op.device)) {
      // Copied out on the copy stream; the slot goes back to the peer once that has run.
      slot_acquired(pp.slot);
      pp.copy = device_copy_async(c, op.data + op.got, pp.slot, h.part_bytes);
      if (pp.copy == 0) return true;
    } else if (h.part_bytes > 0) {
      std::memcpy(op.data + op.got, c.in_.payload + idx * slot_bytes, h.part_bytes);
    }
    ++c.in_taken_;
    if (pp.copy == 0 && c.in_pending_.empty()) {
      c.in_.ctl->tail.store(++c.in_tail_, std::memory_order_release);
      released = true;
    } else {
      c.in_pending_.push_back(pp);
      g_pending.fetch_add(1, std::memory_order_relaxed);
    }
    op.got += h.part_bytes;
    op.started = true;
    moved = true;
    --budget;
    if (op.got == op.bytes) ++c.recv_idx_;
  }
  // Slots behind a copy out: released in ring order once the copy stream has run theirs.
  const std::uint64_t done = c.copies_done_.load(std::memory_order_acquire);
  while (!c.in_pending_.empty() && c.in_pending_.front().copy <= done) {
    const PendingPart& pp = c.in_pending_.front();
    if (pp.copy != 0) slot_released(pp.slot);
    c.in_.ctl->tail.store(++c.in_tail_, std::memory_order_release);
    c.in_pending_.pop_front();
    g_pending.fetch_sub(1, std::memory_order_relaxed);
    released = true;
    moved = true;
  }
  // Receives complete in order, once every part is in the caller's buffer.
  while (c.recv_idx_ > 0) {
    RecvOp& f = c.recvs_.front();
    if (!c.in_pending_.empty() && c.in_pending_.front().msg == f.seq) break;
    f.req->state = Request::State::done;
    c.recvs_.pop_front();
    --c.recv_idx_;
    moved = true;
  }
  if (released) bell_if_flagged(c, c.in_.ctl->producer_waiting);
  return moved;
}

bool ShmTransport::service_socket(ShmConnection& c) {
  bool moved = false;
  while (!c.failure_.failed && c.fd_ >= 0) {
    int err = 0;
    if (c.setup_ == ShmConnection::Setup::await_ack) {
      const long needs = wire::ack_needs(c.hs_.data(), c.hs_got_);
      if (needs < 0) {
        const wire::Ack a = wire::decode_ack(c.hs_.data());
        protocol_error(c, "bad answer to the hello (magic " + std::to_string(a.magic) + ", version " +
                              std::to_string(a.version) + ")");
        return true;
      }
      const auto need = static_cast<std::size_t>(needs);
      if (c.hs_got_ == need) {
        const wire::Ack a = wire::decode_ack(c.hs_.data());
        on_ack(c, a, std::string(reinterpret_cast<const char*>(c.hs_.data()) + wire::kAckBytes, a.reason_bytes));
        continue;
      }
      if (c.hs_.size() < need) c.hs_.resize(need);
      const int r = read_with_fd(c.fd_, c.hs_.data(), &c.hs_got_, need, nullptr, &err);
      if (r == 0) {
        c.readable_ = false;
        break;
      }
      if (r < 0) {
        fail(c, "cannot connect to rank " + std::to_string(c.peer_) + " over shared memory: " +
                    (r == -1 ? std::string("it closed the connection during set-up (it refused this rank's hello: "
                                           "a different auth token or communicator, or it exited)")
                             : "reading its answer failed: " + errno_text(err)),
             true, c.peer_);
        return true;
      }
      moved = true;
      continue;  // the ack's fixed part is judged above, then the reason read, then on_ack
    }
    if (c.setup_ != ShmConnection::Setup::up) break;
    unsigned char buf[256];
    const ssize_t r = ::recv(c.fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      if (!take_socket_bytes(c, buf, static_cast<std::size_t>(r))) return true;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c.readable_ = false;
      break;
    }
    if (r == 0 || errno == ECONNRESET || errno == EPIPE) {
      on_eof(c);
      return true;
    }
    fail(c, c.who() + " failed: recv: " + errno_text(errno), true, c.peer_);
    return true;
  }
  return moved;
}

bool ShmTransport::take_socket_bytes(ShmConnection& c, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (c.notice_.empty()) {
      if (p[i] == wire::kBell) continue;
      if (p[i] != wire::kNotice) {
        protocol_error(c, "unexpected byte " + std::to_string(p[i]) + " on the doorbell socket");
        return false;
      }
    }
    c.notice_.push_back(static_cast<char>(p[i]));
    if (c.notice_.size() < wire::kNoticeHeader) continue;
    const auto* h = reinterpret_cast<const unsigned char*>(c.notice_.data());
    const auto len = static_cast<std::size_t>(le::get(h + 1, 2));
    if (len > kMaxNoticeBytes) {
      protocol_error(c, "a failure notice of " + std::to_string(len) + " bytes on the doorbell socket");
      return false;
    }
    if (c.notice_.size() < wire::kNoticeHeader + len) continue;
    int blamed = -1;
    std::string why;
    (void)decode_notice(h + 3, 4 + len, kMaxNoticeBytes, &blamed, &why);  // sizes checked above
    // The close follows; what it fails carries these words (Failure::note).
    c.failure_.note(c.peer_, blamed >= 0 && blamed < opts_.size ? blamed : -1, why);
    c.notice_.clear();
  }
  return true;
}

void ShmTransport::tell_peers(int blame, const std::string& reason) {
  const std::string why = reason.substr(0, kMaxNoticeBytes);
  std::vector<unsigned char> frame(3);
  frame[0] = wire::kNotice;
  le::put(&frame[1], why.size(), 2);
  const std::vector<unsigned char> body = encode_notice(blame, why);
  frame.insert(frame.end(), body.begin(), body.end());
  for (ShmConnection* c : conns_.all()) {
    if (c->failure_.failed || c->setup_ != ShmConnection::Setup::up || c->fd_ < 0) continue;
    (void)::send(c->fd_, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // never waits
  }
}

void ShmTransport::on_eof(ShmConnection& c) {
  close_socket(c);
  c.eof_ = true;
  changed();
  // What the peer published before it went is still in our mapping; progress()
  // completes what it can from there and fails the rest.
}

// ---------------------------------------------------------------------------
// Connecting (the lower rank of a pair).

void ShmTransport::start_connect(ShmConnection& c) {
  // The peer's socket name comes from the store (PeerLookup: never blocks).
  const auto now = Clock::now();
  const bool first = c.setup_ == ShmConnection::Setup::wanted;
  c.setup_ = ShmConnection::Setup::lookup;
  const std::string to = "cannot connect to rank " + std::to_string(c.peer_) + " over shared memory: ";
  std::string error;
  const std::optional<std::string> found = look_up(c.lookup_, first, c.peer_, "shm", "its doorbell socket",
                                                   "has it started, with the shm transport?", &error);
  if (!found) {
    if (!error.empty()) fail(c, to + error, false, c.peer_);
    return;
  }
  if (!valid_socket_name(*found)) {
    fail(c, to + "it published the doorbell socket name '" + found->substr(0, 80) + "', expected braid-shm-...",
         false, c.peer_);
    return;
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) {
    fail(c, to + "socket(AF_UNIX) failed: " + errno_text(errno), false, c.peer_);
    return;
  }
  socklen_t len = 0;
  const sockaddr_un a = abstract_addr(*found, &len);
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int err = errno;
    if ((err == EAGAIN || err == EINTR) && now < c.lookup_.deadline) {
      // Its accept backlog is full: try again shortly.
      c.lookup_.later(now);
      deadlines_changed();
      return;
    }
    fail(c, to + "connecting to its doorbell socket @" + *found + " failed: " + errno_text(err) +
                (err == ECONNREFUSED ? " (is it on this host, in the same network namespace, and still running? "
                                       "BRAID_TRANSPORT=tcp avoids shared memory)"
                                     : ""),
         true, c.peer_);
    return;
  }
  c.fd_ = sock.release();
  c.peer_pid_ = peer_pid(c.fd_);
  UniqueFd seg;
  wire::Hello h;
  h.token_bytes = static_cast<std::uint16_t>(base::auth::kProofBytes);
  h.from_rank = opts_.rank;
  h.to_rank = c.peer_;
  h.slots = static_cast<std::uint32_t>(opts_.slots);
  h.comm_id = opts_.comm_id;
  h.slot_bytes = opts_.slot_bytes;
  const bool created = create_segment(c, &seg, &error);
  if (!created) {
    // Tell the peer why, so that both sides report the same cause.
    if (error.size() > wire::kMaxReasonBytes) error.resize(wire::kMaxReasonBytes);
    h.status = wire::kStatusFailed;
    h.reason_bytes = static_cast<std::uint16_t>(error.size());
  }
  int err = 0;
  const std::string fixed = wire::hello_bytes(h, "", "");
  const bool sent = send_handshake(c.fd_, fixed + hello_proof(opts_.auth_token, fixed) + (created ? "" : error),
                                   created ? seg.get() : -1, &err);
  if (!created) {
    fail(c, error, false, c.peer_);
    return;
  }
  if (!sent) {
    fail(c, to + "sending the hello failed: " + errno_text(err), true, c.peer_);
    return;
  }
  c.setup_ = ShmConnection::Setup::await_ack;
  c.deadline_ = Clock::now() + opts_.connect_timeout;
  c.hs_got_ = 0;
  c.readable_ = true;
  watch_conn(c);
  deadlines_changed();
}

bool ShmTransport::create_segment(ShmConnection& c, UniqueFd* out, std::string* error) {
  const std::string& dir = opts_.segment_dir;
  const std::string name = shm_segment_name(opts_.comm_id, opts_.rank, c.peer_);
  const std::string path = dir + "/" + name;
  const std::uint64_t need = layout_.total_bytes;
  const std::string head = "shm transport: rank " + std::to_string(opts_.rank) +
                           " cannot create the shared-memory segment for ranks " + std::to_string(opts_.rank) +
                           " and " + std::to_string(c.peer_) + " (" + path + ", " + mib(need) + "): ";
  const std::string fixes = "Each pair of ranks on a host needs 2 x slots x slot_bytes (here 2 x " +
                            std::to_string(opts_.slots) + " x " + mib(opts_.slot_bytes) +
                            "). Enlarge " + dir +
                            " (docker run --shm-size=1g, or mount -o remount,size=2g " + dir +
                            "), use fewer or smaller shm slots, or set BRAID_TRANSPORT=tcp.";
  auto too_small = [&](const struct statvfs& st) {
    const std::uint64_t total = std::uint64_t{st.f_blocks} * st.f_frsize;
    const std::uint64_t avail = std::uint64_t{st.f_bavail} * st.f_frsize;
    *error = head + dir + " is too small: " + mib(avail) + " free of " + mib(total) + ", " + mib(need) +
             " needed. " + fixes;
  };
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) {
    *error = head + "cannot use " + dir + ": " + errno_text(errno) + ". Set BRAID_TRANSPORT=tcp to avoid shared memory.";
    return false;
  }
  if (std::uint64_t{st.f_bavail} * st.f_frsize < need) {
    too_small(st);
    return false;
  }
  UniqueFd fd;
  for (int attempt = 0; attempt < 2 && fd.get() < 0; ++attempt) {
    fd = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    // A name left by a killed rank of this communicator (ids are random per
    // communicator, so it cannot belong to anyone else): replace it.
    if (fd.get() < 0 && errno == EEXIST && attempt == 0) ::unlink(path.c_str());
  }
  if (fd.get() < 0) {
    *error = head + "open: " + errno_text(errno) + ". Set BRAID_TRANSPORT=tcp to avoid shared memory.";
    return false;
  }
  // From here on the name must go whatever happens.
  struct Unlink {
    const std::string& p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_guard{path};
  // posix_fallocate reserves every page now, so that a full tmpfs is reported here
  // and not as SIGBUS on first touch.
  int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(need));
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd.get(), static_cast<off_t>(need)) == 0 ? 0 : errno;
  if (rc == ENOSPC) {
    ::statvfs(dir.c_str(), &st);
    too_small(st);
    return false;
  }
  if (rc != 0) {
    *error = head + "sizing it failed: " + errno_text(rc) + ". " + fixes;
    return false;
  }
  void* base = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    *error = head + "mmap: " + errno_text(errno) + ". " + fixes;
    return false;
  }
  Mapping map(base, need);
  auto* sh = reinterpret_cast<wire::SegmentHeader*>(map.get());
  sh->magic = wire::kSegmentMagic;
  sh->version = wire::kVersion;
  sh->slots = static_cast<std::uint32_t>(opts_.slots);
  sh->slot_bytes = opts_.slot_bytes;
  sh->comm_id = opts_.comm_id;
  sh->rank_lo = opts_.rank;
  sh->rank_hi = c.peer_;
  sh->total_bytes = need;
  for (int ring = 0; ring < 2; ++ring) new (map.get() + layout_.ring_offset(ring)) wire::RingControl();
  make_device_ring(c, sh);
  attach(c, std::move(map));
  *out = std::move(fd);
  return true;
}

void ShmTransport::attach(ShmConnection& c, Mapping map) {
  c.map_ = std::move(map);
  const int lo = std::min(opts_.rank, c.peer_);
  const int out_ring = opts_.rank == lo ? 0 : 1;
  c.out_ = ring_view(c.map_.get(), layout_, out_ring);
  c.in_ = ring_view(c.map_.get(), layout_, 1 - out_ring);
}

void ShmTransport::make_device_ring(ShmConnection& c, wire::SegmentHeader* sh) {
  sh->device_ring_bytes = 0;
  if (opts_.gpu == nullptr || opts_.gpu_device < 0 || !opts_.device_ring) return;
  const std::uint64_t bytes = 2 * layout_.slots * layout_.slot_bytes;
  try {
    if (c.dev_owned_ == nullptr) {
      c.dev_owned_ = opts_.gpu->alloc_device(bytes, opts_.gpu_device);
      std::lock_guard<std::mutex> g(local_rings().mu);
      local_rings().users[c.dev_owned_] = 1;
    }
    gpu::IpcHandle h = opts_.gpu->ipc_export(c.dev_owned_);
    if (h.fd >= 0) ::close(h.fd);  // what hi needs is in the bytes (ipc_open without a passed fd)
    if (h.bytes.size() > wire::kMaxIpcBytes) throw Error(ErrorCode::Internal, "an IPC handle of " + std::to_string(h.bytes.size()) + " bytes");
    std::memcpy(sh->ipc, h.bytes.data(), h.bytes.size());
    sh->ipc_bytes = static_cast<std::uint32_t>(h.bytes.size());
  } catch (const std::exception& e) {
    BRAID_LOG(info, self() << ": no device ring with rank " << c.peer_ << " (" << e.what()
                           << "): its device messages go through the host ring");
    return;
  }
  sh->device_ring_bytes = bytes;
  sh->device_ring_ptr = reinterpret_cast<std::uintptr_t>(c.dev_owned_);
  sh->lo_pid = ::getpid();
  sh->device = opts_.gpu_device;
}

bool ShmTransport::open_device_ring(ShmConnection& c, const wire::SegmentHeader& sh) {
  const std::uint64_t bytes = 2 * layout_.slots * layout_.slot_bytes;
  if (opts_.gpu == nullptr || opts_.gpu_device < 0 || !opts_.device_ring || sh.device_ring_bytes != bytes ||
      sh.ipc_bytes > wire::kMaxIpcBytes)
    return false;
  // The same process by the kernel's word (SO_PEERCRED), not by the pid number lo wrote: a
  // process in another PID namespace may carry ours.
  if (c.peer_pid_ == ::getpid()) {
    // Ranks that are threads of one process: lo's pointer is ours too (CUDA cannot open a
    // handle of its own process), if it is a ring this process made.
    const void* p = reinterpret_cast<const void*>(sh.device_ring_ptr);
    if (!share_local_ring(p)) return false;
    c.dev_shared_ = const_cast<void*>(p);
    c.dev_in_ = static_cast<unsigned char*>(c.dev_shared_);
  } else {
    try {
      gpu::IpcHandle h;
      h.bytes.assign(reinterpret_cast<const char*>(sh.ipc), sh.ipc_bytes);
      c.dev_opened_ = opts_.gpu->ipc_open(std::move(h), bytes);
    } catch (const std::exception& e) {
      BRAID_LOG(info, self() << ": cannot map the device ring of rank " << c.peer_ << " (" << e.what()
                             << "): device messages with it go through the host ring");
      return false;
    }
    c.dev_in_ = static_cast<unsigned char*>(c.dev_opened_);
  }
  // hi reads ring 0 (dev_in_, the ring's start) and writes ring 1: the host rings' directions.
  c.dev_out_ = c.dev_in_ + layout_.slots * layout_.slot_bytes;
  return true;
}

void ShmTransport::release_device_ring(ShmConnection& c) noexcept {
  if (c.dev_opened_ != nullptr) opts_.gpu->ipc_close(c.dev_opened_);
  for (void* p : {c.dev_owned_, c.dev_shared_})
    if (p != nullptr && release_local_ring(p)) opts_.gpu->free_device(p);
  c.dev_opened_ = c.dev_owned_ = c.dev_shared_ = nullptr;
  c.dev_in_ = c.dev_out_ = nullptr;
}


std::uint64_t ShmTransport::device_copy_async(ShmConnection& c, void* dst, const void* src, std::size_t n) {
  try {
    gpu::ScopedDevice on(*opts_.gpu, opts_.gpu_device);  // whatever thread drives progress
    if (c.copy_stream_ == nullptr) c.copy_stream_ = opts_.gpu->create_stream();
    opts_.gpu->copy_async(dst, src, n, c.copy_stream_);
    opts_.gpu->launch_host(c.copy_stream_, &count_copy_done, &c.copies_done_);
    return ++c.copies_issued_;
  } catch (const std::exception& e) {
    fail(c, c.who() + ": copying " + std::to_string(n) + " bytes of a device message failed: " + e.what(), false, -1);
    return 0;
  }
}

void ShmTransport::destroy_copy_stream(ShmConnection& c) noexcept {
  if (c.copy_stream_ == nullptr) return;
  try {
    gpu::ScopedDevice on(*opts_.gpu, opts_.gpu_device);  // whatever thread drives progress
    opts_.gpu->destroy_stream(c.copy_stream_);
  } catch (...) {
  }
  c.copy_stream_ = nullptr;
}

void ShmTransport::finish_copies(ShmConnection& c) noexcept {
  if (c.copy_stream_ == nullptr) return;
  try {
    gpu::ScopedDevice on(*opts_.gpu, opts_.gpu_device);  // whatever thread drives progress
    opts_.gpu->synchronize(c.copy_stream_);
  } catch (const std::exception& e) {
    BRAID_LOG(warn, self() << ": waiting for the copies of " << c.who() << " failed: " << e.what());
  }
  g_pending.fetch_sub(static_cast<long>(c.out_pending_.size() + c.in_pending_.size()), std::memory_order_relaxed);
  c.out_pending_.clear();
  c.in_pending_.clear();
}

void ShmTransport::on_ack(ShmConnection& c, const wire::Ack& a, const std::string& reason) {
  if (a.status != wire::kStatusOk) {
    fail(c, "rank " + std::to_string(c.peer_) + " refused the shared-memory connection from rank " +
                std::to_string(opts_.rank) + ": " + reason,
         false, c.peer_);
    return;
  }
  if ((a.flags & wire::kAckDeviceRing) != 0 && c.dev_owned_ != nullptr) {
    // lo writes ring 0, reads ring 1.
    auto* base = static_cast<unsigned char*>(c.dev_owned_);
    c.dev_out_ = base;
    c.dev_in_ = base + layout_.slots * layout_.slot_bytes;
  } else if (c.dev_owned_ != nullptr) {
    release_device_ring(c);  // hi did not map it: no use keeping 2 x slots x slot_bytes of GPU memory
  }
  c.setup_ = ShmConnection::Setup::up;
  c.hs_.clear();
  c.hs_.shrink_to_fit();
  changed();
}

// ---------------------------------------------------------------------------
// Accepting (the higher rank of a pair).

std::string ShmTransport::refusal(const PendingAccept& pa, bool valid) const {
  const pid_t pid = peer_pid(pa.fd.get());
  return self() + ": refused a connection to its doorbell socket" +
         (pid > 0 ? " from pid " + std::to_string(pid) : std::string()) +
         (!same_user(pa.fd.get()) ? ": it runs as another user"
          : valid ? ": its hello names another communicator, rank or token, or comes from a peer whose connection "
                  "already failed"
                : ": not a braid shm hello of this version");
}

bool ShmTransport::adopt(PendingAccept& pa) {
  if (!same_user(pa.fd.get())) return false;
  const wire::Hello h = wire::decode_hello(pa.buf.data());
  if (!authentic({h.comm_id, h.from_rank, h.to_rank, pa.buf.data() + wire::kHelloBytes, h.token_bytes, pa.buf.data(),
                   wire::kHelloBytes}))
    return false;
  ShmConnection& c = get_conn(h.from_rank);
  if (c.failure_.failed) return false;
  if (c.fd_ >= 0 || c.setup_ != ShmConnection::Setup::idle) {
    protocol_error(c, "rank " + std::to_string(h.from_rank) + " connected twice");
    return false;
  }
  c.fd_ = pa.fd.release();  // now owned by the connection
  c.peer_pid_ = peer_pid(c.fd_);
  const std::string reason(reinterpret_cast<const char*>(pa.buf.data()) + wire::kHelloBytes + h.token_bytes,
                           h.reason_bytes);
  if (h.status != wire::kStatusOk) {
    fail(c, "rank " + std::to_string(h.from_rank) + " could not set up shared memory with rank " +
                std::to_string(opts_.rank) + ": " + reason,
         false, c.peer_);
    return true;
  }
  auto refuse = [&](const std::string& why) {
    wire::Ack a;
    a.status = wire::kStatusFailed;
    const std::string text = why.substr(0, wire::kMaxReasonBytes);
    a.reason_bytes = static_cast<std::uint16_t>(text.size());
    int err = 0;
    send_handshake(c.fd_, wire::ack_bytes(a, text), -1, &err);
    fail(c, why, false, c.peer_);
    return true;
  };
  if (h.slots != static_cast<std::uint32_t>(opts_.slots) || h.slot_bytes != opts_.slot_bytes) {
    return refuse("shm transport: rank " + std::to_string(h.from_rank) + " uses " + std::to_string(h.slots) +
                  " slots of " + std::to_string(h.slot_bytes) + " bytes, rank " + std::to_string(opts_.rank) +
                  " uses " + std::to_string(opts_.slots) + " slots of " + std::to_string(opts_.slot_bytes) +
                  " bytes; every rank must use the same settings");
  }
  if (!pa.passed) return refuse("shm transport: protocol error: the hello of rank " +
                                          std::to_string(h.from_rank) + " carried no segment");
  struct stat st {};
  if (::fstat(pa.passed.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) != layout_.total_bytes) {
    return refuse("shm transport: the segment rank " + std::to_string(h.from_rank) + " passed is not a " +
                  std::to_string(layout_.total_bytes) + "-byte file");
  }
  void* base = ::mmap(nullptr, layout_.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pa.passed.get(), 0);
  if (base == MAP_FAILED) {
    return refuse("shm transport: rank " + std::to_string(opts_.rank) + " cannot map the segment of " +
                  mib(layout_.total_bytes) + " from rank " + std::to_string(h.from_rank) + ": " + errno_text(errno));
  }
  Mapping map(base, layout_.total_bytes);
  pa.passed.reset();
  wire::SegmentHeader sh;
  std::memcpy(&sh, map.get(), sizeof sh);
  if (sh.magic != wire::kSegmentMagic || sh.version != wire::kVersion || sh.slots != h.slots ||
      sh.slot_bytes != h.slot_bytes || sh.comm_id != opts_.comm_id || sh.rank_lo != h.from_rank ||
      sh.rank_hi != opts_.rank || sh.total_bytes != layout_.total_bytes) {
    return refuse("shm transport: the segment rank " + std::to_string(h.from_rank) +
                  " passed has a header that does not match its hello");
  }
  attach(c, std::move(map));
  wire::Ack ack;
  if (open_device_ring(c, sh)) ack.flags = wire::kAckDeviceRing;
  int err = 0;
  if (!send_handshake(c.fd_, wire::ack_bytes(ack, ""), -1, &err)) {
    fail(c, c.who() + ": sending the answer to its hello failed: " + errno_text(err), true, c.peer_);
    return true;
  }
  // Up: lo reads the ring once it has the Ack, and any later socket byte is a bell.
  c.setup_ = ShmConnection::Setup::up;
  c.readable_ = true;
  watch_conn(c);  // replaces the hello handler
  changed();
  return true;
}

// ---------------------------------------------------------------------------
// Deadlines: lookup retries and answers that never come (the skeleton adds hellos).

Clock::time_point ShmTransport::connection_deadlines(Clock::time_point now) {
  auto next = Clock::time_point::max();
  for (ShmConnection* c : conns_.all()) {
    if (c->failure_.failed) continue;
    if (c->setup_ == ShmConnection::Setup::lookup) {
      if (now >= c->lookup_.retry_at) start_connect(*c);
      if (!c->failure_.failed && c->setup_ == ShmConnection::Setup::lookup) next = std::min(next, c->lookup_.retry_at);
    }
    if (c->failure_.failed) continue;
    if (c->setup_ == ShmConnection::Setup::await_ack) {
      if (now >= c->deadline_) {
        fail(*c, "cannot connect to rank " + std::to_string(c->peer_) + " over shared memory: no answer within " +
                     std::to_string(opts_.connect_timeout.count()) + " ms",
             true, c->peer_);
        continue;
      }
      next = std::min(next, c->deadline_);
    }
  }
  return next;
}

}  // namespace

// ---------------------------------------------------------------------------

long shm_parts_behind_copies() noexcept { return g_pending.load(std::memory_order_relaxed); }

std::size_t shm_segment_bytes(std::size_t slot_bytes, int slots) {
  return wire::layout(slot_bytes, static_cast<std::size_t>(slots < 0 ? 0 : slots)).total_bytes;
}

std::string shm_segment_name(std::uint64_t comm_id, int a, int b) {
  return "braid-" + hex16(comm_id) + "-" + std::to_string(std::min(a, b)) + "-" + std::to_string(std::max(a, b));
}

std::unique_ptr<Transport> make_shm_transport(const ShmOptions& options, Poller& poller, PeerDirectory& directory) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw Error(ErrorCode::InvalidUsage, "shm transport: rank " + std::to_string(options.rank) +
                                             " is not in a world of size " + std::to_string(options.size));
  }
  if (options.slots < 1 || options.slots > wire::kMaxSlots) {
    throw Error(ErrorCode::InvalidUsage, "shm transport: slots must be in 1.." + std::to_string(wire::kMaxSlots) +
                                             ", got " + std::to_string(options.slots));
  }
  if (options.slot_bytes < wire::kMinSlotBytes || options.slot_bytes > wire::kMaxSlotBytes ||
      options.slot_bytes % wire::kPage != 0) {
    throw Error(ErrorCode::InvalidUsage, "shm transport: slot_bytes must be a multiple of 4096 in [4096, 1 GiB], got " +
                                             std::to_string(options.slot_bytes));
  }
  if (options.auth_token.size() > wire::kMaxTokenBytes) {
    throw Error(ErrorCode::InvalidUsage, "shm transport: the auth token is longer than " +
                                             std::to_string(wire::kMaxTokenBytes) + " bytes");
  }
  if (options.segment_dir.empty()) {
    throw Error(ErrorCode::InvalidUsage, "shm transport: empty segment directory");
  }
  return std::make_unique<ShmTransport>(options, poller, directory);
}

}  // namespace braid::transport
