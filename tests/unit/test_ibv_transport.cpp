// What only the ibverbs transport has, beyond the conformance suite (which runs it over the
// test provider like every transport): the checks of what a peer writes into our memory
// (slot headers, credits, immediates), its choices and refusals at creation (BRAID_IB_HCA,
// GID index, slot settings), the rendezvous path with and without the registration cache,
// InfiniBand (LID) addressing, and faults the provider injects (an error completion, the
// port going down). Everything runs on tests/support/fakeverbs: hardware-untested.
#include "test_support.hpp"
#include "transport_harness.hpp"

#include "gpu/runtime.hpp"
#include "transport/ibverbs/ibv_discovery.hpp"
#include "transport/registry.hpp"

#include <braid/config.hpp>

#if BRAID_HAVE_IBVERBS
#include "transport/ibverbs/ibv_transport.hpp"
#include "transport/ibverbs/ibv_wire.hpp"
#endif

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

using namespace braid::test;
using namespace std::chrono_literals;

#if BRAID_HAVE_IBVERBS && defined(BRAID_FAKEVERBS_LIBRARY)

namespace {

namespace wire = braid::transport::ibverbs::wire;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// --- What a peer writes ------------------------------------------------------------------

std::vector<unsigned char> slot_with(wire::SlotHeader h, std::size_t slot_bytes = 256) {
  std::vector<unsigned char> s(slot_bytes);
  wire::put_header(s.data(), h);
  return s;
}

TEST(IbvWire, HeadersRoundTripAndAreCheckedAgainstTheirSlot) {
  const std::size_t room = 256 - wire::kHeaderBytes;
  wire::SlotHeader in;
  in.kind = wire::kData;
  in.chunk = static_cast<std::uint32_t>(room);
  in.tag = 0x1234'5678'9abc'def0ull;
  in.total = 1000;
  in.offset = room;
  wire::SlotHeader out;
  std::string why;
  ASSERT_TRUE(wire::get_header(slot_with(in).data(), 256, &out, &why)) << why;
  EXPECT_EQ(out.tag, in.tag);
  EXPECT_EQ(out.total, 1000u);
  EXPECT_EQ(out.offset, room);
  EXPECT_EQ(out.chunk, room);

  struct Bad {
    const char* what;
    wire::SlotHeader h;
    const char* says;
  };
  auto h = [](std::uint32_t kind, std::uint32_t chunk, std::uint64_t total, std::uint64_t offset) {
    wire::SlotHeader x;
    x.kind = kind;
    x.chunk = chunk;
    x.total = total;
    x.offset = offset;
    return x;
  };
  const std::vector<Bad> bad = {
      {"unknown kind", h(9, 0, 0, 0), "unknown kind 9"},
      {"chunk larger than the slot", h(wire::kData, static_cast<std::uint32_t>(room + 1), 10000, 0), "in a slot of 256"},
      {"chunk past the end", h(wire::kData, 10, 15, 10), "of a 15-byte message"},
      {"offset past the end", h(wire::kData, 0, 5, 6), "of a 5-byte message"},
      {"short chunk mid-message", h(wire::kData, 10, 1000, 0), "short chunk"},
      {"bye with data", h(wire::kBye, 4, 4, 0), "carrying data"},
      {"rts with an offset", h(wire::kRts, 0, 4096, 8), "carrying data"},
  };
  for (const Bad& b : bad) {
    why.clear();
    EXPECT_FALSE(wire::get_header(slot_with(b.h).data(), 256, &out, &why)) << b.what;
    EXPECT_TRUE(has(why, b.says)) << b.what << ": " << why;
  }
  // The last chunk may be short, a 0-byte message is one empty chunk.
  EXPECT_TRUE(wire::get_header(slot_with(h(wire::kData, 10, room + 10, room)).data(), 256, &out, &why)) << why;
  EXPECT_TRUE(wire::get_header(slot_with(h(wire::kData, 0, 0, 0)).data(), 256, &out, &why)) << why;
}

TEST(IbvWire, CreditsNeverLetTheSenderPastTheRingAndRefuseImpossibleCounts) {
  EXPECT_EQ(wire::credits(16, 0, 0), 16);
  EXPECT_EQ(wire::credits(16, 16, 0), 0);
  EXPECT_EQ(wire::credits(16, 20, 4), 0);
  EXPECT_EQ(wire::credits(16, 20, 20), 16);
  EXPECT_EQ(wire::credits(16, 20, 21), -1);  // more freed than written
  EXPECT_EQ(wire::credits(16, 40, 20), -1);  // more in flight than the ring holds
  EXPECT_EQ(wire::slots_for(0, 256), 1u);
  EXPECT_EQ(wire::slots_for(224, 256), 1u);
  EXPECT_EQ(wire::slots_for(225, 256), 2u);
}

TEST(IbvWire, StripesCoverTheMessageOnceAndUseEveryLaneOnlyForLargeMessages) {
  for (std::size_t lanes : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{16}}) {
    for (std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096}, wire::kMinStripe - 1,
                                wire::kMinStripe, 2 * wire::kMinStripe - 1, 2 * wire::kMinStripe,
                                3 * wire::kMinStripe + 5, std::uint64_t{1} << 20, (std::uint64_t{1} << 28) + 12345}) {
      std::uint64_t per = 0;
      const std::uint64_t n = wire::stripes(bytes, lanes, &per);
      SCOPED_TRACE(std::to_string(bytes) + " bytes over " + std::to_string(lanes) + " lanes");
      ASSERT_GE(n, 1u);
      EXPECT_LE(n, lanes);
      if (bytes < 2 * wire::kMinStripe) {
        EXPECT_EQ(n, 1u);  // small messages stay on the first QP
      }
      if (bytes >= lanes * wire::kMinStripe) {
        EXPECT_EQ(n, lanes);  // large ones use every QP
      }
      EXPECT_EQ(per % 4096, 0u);
      // Every stripe has bytes, and together they cover the message exactly once.
      EXPECT_LT((n - 1) * per, std::max<std::uint64_t>(bytes, 1));
      EXPECT_GE(n * per, bytes);
    }
  }
}

TEST(IbvWire, ImmediatesCarryTheirKindAndTwentyEightBits) {
  for (const wire::Imm k : {wire::kImmData, wire::kImmCredit, wire::kImmCts, wire::kImmRndvDone}) {
    const std::uint32_t v = wire::imm(k, 0x1234567);
    EXPECT_EQ(wire::imm_kind(v), k);
    EXPECT_EQ(wire::imm_low(v), 0x1234567u);
  }
  EXPECT_EQ(wire::imm_low(wire::imm(wire::kImmCts, 0xfffffffffull)), 0x0fffffffu);  // cut to 28 bits
  EXPECT_NE(wire::imm(wire::kImmData, 0), 0u);  // 0 means "no immediate" to the poster
}

// --- The transport over the test provider -------------------------------------------------

/// Sets environment variables for the life of a scope (the provider reads its own when a
/// device is opened, i.e. when a transport is made).
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k, v, 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// The ibverbs entry's factory with some of its rows set, over the test provider (the
/// support library points BRAID_IBVERBS_LIBRARY at it).
TransportFactory ibverbs(std::map<std::string, std::string> rows = {}) { return entry_factory("ibverbs", std::move(rows)); }

std::function<bt::CommonOptions(int)> opts(int size) {
  const std::uint64_t comm = fresh_comm_id();
  return [=](int r) { return common_options(r, size, comm); };
}

/// Each way between two ranks: messages of `sizes`, in order, checked.
void exchange(TransportRank& r, const std::vector<std::size_t>& sizes) {
  bt::Connection* c = r.to(1 - r.rank);
  std::vector<std::vector<unsigned char>> out(sizes.size()), in(sizes.size());
  std::vector<bt::Request> s(sizes.size()), q(sizes.size());
  std::vector<bt::Request*> all;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out[i].resize(sizes[i]);
    for (std::size_t k = 0; k < sizes[i]; ++k) out[i][k] = static_cast<unsigned char>(k * 7 + i + r.rank);
    in[i].assign(sizes[i], 0xee);
    c->recv(in[i].data(), sizes[i], 100 + i, &q[i]);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) c->send(out[i].data(), sizes[i], 100 + i, &s[i]);
  for (std::size_t i = 0; i < sizes.size(); ++i) all.push_back(&s[i]), all.push_back(&q[i]);
  ASSERT_TRUE(r.drive(all, 60s));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(s[i].state, State::done) << s[i].error;
    ASSERT_EQ(q[i].state, State::done) << q[i].error;
    for (std::size_t k = 0; k < sizes[i]; ++k) {
      ASSERT_EQ(in[i][k], static_cast<unsigned char>(k * 7 + i + 1 - r.rank)) << "message " << i << " byte " << k;
    }
  }
}

TEST(IbvTransport, RendezvousAndEagerMessagesInterleaveInOrderWithAndWithoutTheRegistrationCache) {
  // A low threshold so that every other message goes by rendezvous; small slots so that
  // the eager ones take several; a ring of 4 slots so that credits run out.
  const std::vector<std::size_t> sizes = {0, 5000, 100, 70000, 4096, 1 << 20, 1, 3 << 20, 0, 333};
  for (const char* cache : {"0", "1"}) {
    SCOPED_TRACE(std::string("BRAID_IB_REG_CACHE=") + cache);
    run_thread_ranks(2, opts(2),
                     ibverbs({{"BRAID_IB_RNDV_THRESHOLD", "4K"},
                              {"BRAID_IB_SLOT_BYTES", "1K"},
                              {"BRAID_IB_SLOTS", "4"},
                              {"BRAID_IB_REG_CACHE", cache}}),
                     [&](TransportRank& r) {
                       for (int round = 0; round < 3; ++round) exchange(r, sizes);
                     });
  }
}

TEST(IbvTransport, LargeMessagesAreStripedOverSeveralQueuePairsAndArriveWhole) {
  // 4 QPs per peer: messages from 128 KiB on are split into 2 to 4 stripes of unequal
  // last size, each completing on its own QP; small and eager ones stay on the first. The
  // receiver completes a message only once every stripe's immediate is in, so a stripe
  // that went astray or a count that disagreed would hang or corrupt this exchange.
  const std::vector<std::size_t> sizes = {1,       70000,   2 * 65536, 200000, 1 << 20,
                                          100,     (3 << 20) + 7, 4096,   0,      (1 << 20) - 1};
  run_thread_ranks(2, opts(2), ibverbs({{"BRAID_IB_QPS_PER_PEER", "4"}, {"BRAID_IB_RNDV_THRESHOLD", "64K"}}),
                   [&](TransportRank& r) {
                     for (int round = 0; round < 3; ++round) exchange(r, sizes);
                   });
  // Across processes, with the QP count at its bound.
  run_process_ranks(2, opts(2), ibverbs({{"BRAID_IB_QPS_PER_PEER", "16"}}),
                    [](TransportRank& r) { exchange(r, {5, 16 << 20, 300000, 0}); });
}

TEST(IbvTransport, DiscoveryListsTheProvidersDeviceAsBraidInfoShowsIt) {
  namespace ib = braid::transport::ibverbs;
  const ib::Discovery d = ib::discover(BRAID_FAKEVERBS_LIBRARY);
  ASSERT_TRUE(d.loaded) << d.why;
  ASSERT_EQ(d.devices.size(), 1u);
  const ib::Device& dev = d.devices[0];
  EXPECT_EQ(dev.name, "fakeverbs0");
  ASSERT_EQ(dev.ports.size(), 1u);
  EXPECT_EQ(dev.ports[0].state, "ACTIVE");
  EXPECT_EQ(dev.ports[0].link_layer, "Ethernet");
  EXPECT_EQ(dev.ports[0].active_mtu, 4096);
  ASSERT_GE(dev.ports[0].gids.size(), 2u);
  EXPECT_EQ(dev.ports[0].gids[1].text, "::ffff:127.0.0.1");
  EXPECT_TRUE(has(ib::summary(d), "fakeverbs0 port 1 ACTIVE Ethernet MTU 4096")) << ib::summary(d);
}

TEST(IbvTransport, InfiniBandPortsAreAddressedByLid) {
  ScopedEnv env({{"FAKEVERBS_LINK", "ib"}, {"FAKEVERBS_LID", "7"}});
  run_process_ranks(2, opts(2), ibverbs(), [](TransportRank& r) { exchange(r, {0, 1, 70000, 1 << 20}); });
}

TEST(IbvTransport, CreationRefusesWhatCannotWorkNamingTheSetting) {
  MemDirectory dir;
  RankDirectory d(dir, 0);
  struct Case {
    std::map<std::string, std::string> rows;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{"BRAID_IB_HCA", "^fakeverbs"}}, "excluded by BRAID_IB_HCA"},
      {{{"BRAID_IB_HCA", "mlx5_0"}}, "BRAID_IB_HCA"},
      {{{"BRAID_IB_GID_INDEX", "9"}}, "9"},
      {{{"BRAID_IB_SLOTS", "6"}}, "BRAID_IB_SLOTS=6"},
      {{{"BRAID_IB_QPS_PER_PEER", "17"}}, "BRAID_IB_QPS_PER_PEER"},
      {{{"BRAID_IB_QPS_PER_PEER", "0"}}, "BRAID_IB_QPS_PER_PEER"},
      {{{"BRAID_IB_ADDR_RANGE", "10.0.0.0/8"}}, "10.0.0.0/8"},
  };
  for (const Case& c : cases) {
    try {
      TransportRank r(d, common_options(0, 2, fresh_comm_id()), ibverbs(c.rows));
      ADD_FAILURE() << "made a transport with " << c.rows.begin()->first << "=" << c.rows.begin()->second;
    } catch (const braid::Error& e) {
      EXPECT_TRUE(has(e.what(), c.says)) << c.rows.begin()->first << ": " << e.what();
    }
  }
  ScopedEnv down({{"FAKEVERBS_PORT_STATE", "down"}});
  try {
    TransportRank r(d, common_options(0, 2, fresh_comm_id()), ibverbs());
    ADD_FAILURE() << "made a transport on a DOWN port";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braid::ErrorCode::Unsupported);
    EXPECT_TRUE(has(e.what(), "ACTIVE")) << e.what();
  }
}

TEST(IbvTransport, RanksWithOtherSlotOrQueuePairSettingsAreToldToSetThemAlike) {
  for (const auto& [row, value] : {std::pair<std::string, std::string>{"BRAID_IB_SLOTS", "8"},
                                   std::pair<std::string, std::string>{"BRAID_IB_QPS_PER_PEER", "3"}}) {
    MemDirectory dir;
    RankDirectory d0(dir, 0), d1(dir, 1);
    const std::uint64_t comm = fresh_comm_id();
    TransportRank a(d0, common_options(0, 2, comm), ibverbs({{row, value}}));
    TransportRank b(d1, common_options(1, 2, comm), ibverbs());
    std::uint64_t v = 1, w = 0;
    bt::Request s, q;
    a.to(1)->send(&v, sizeof v, 1, &s);
    b.to(0)->recv(&w, sizeof w, 1, &q);
    const auto until = Clock::now() + 20s;
    while ((s.state == State::pending || q.state == State::pending) && Clock::now() < until) {
      a.step();
      b.step();
    }
    ASSERT_EQ(s.state, State::failed) << row;
    EXPECT_TRUE(has(s.error, row)) << s.error;
    EXPECT_EQ(s.failed_peer, 1);
    ASSERT_EQ(q.state, State::failed) << row;
    EXPECT_TRUE(has(q.error, row)) << q.error;
  }
}

TEST(IbvTransport, AnErrorCompletionFailsTheConnectionNamingThePeer) {
  // The provider fails the 41st send work request posted on each rank's device with "retry
  // count exceeded", as an HCA does when the peer stops acknowledging.
  ScopedEnv env({{"FAKEVERBS_FAIL_SEND_AFTER", "40"}});
  run_process_ranks(2, opts(2), ibverbs(), [](TransportRank& r) {
    bt::Connection* c = r.to(1 - r.rank);
    std::vector<std::uint64_t> out(64, 5), in(64);
    std::vector<bt::Request> s(64), q(64);
    std::vector<bt::Request*> all;
    for (int i = 0; i < 64; ++i) c->recv(&in[i], 8, 9, &q[i]);
    for (int i = 0; i < 64; ++i) c->send(&out[i], 8, 9, &s[i]);
    for (int i = 0; i < 64; ++i) all.push_back(&s[i]), all.push_back(&q[i]);
    ASSERT_TRUE(r.drive(all, 30s));
    // Each process fails its own 41st send; the peer's writes then meet a QP in error, so
    // its later work fails too (or its waits end at the probe). Every failure names the peer.
    bool failed = false;
    for (bt::Request* x : all) {
      if (x->state != State::failed) continue;
      failed = true;
      EXPECT_EQ(x->failed_peer, 1 - r.rank) << x->error;
      EXPECT_TRUE(has(x->error, "rank " + std::to_string(1 - r.rank))) << x->error;
    }
    EXPECT_TRUE(failed) << "rank " << r.rank << ": no request failed";
  });
}

TEST(IbvTransport, AMismatchFailsBothSidesAtOnce) {
  // The receiver finds the mismatch; it writes an abort slot before its queue pair goes to
  // ERR, so the sender's next request fails within a moment instead of at its probes'
  // retry limit.
  run_process_ranks(2, opts(2), ibverbs(), [](TransportRank& r) {
    r.handshake(1 - r.rank);
    std::uint64_t v = 7, w = 0;
    bt::Request a, b;
    const auto t0 = Clock::now();
    if (r.rank == 0) {
      r.to(1)->send(&v, sizeof v, 1, &a);
      r.to(1)->recv(&w, sizeof w, 5, &b);
    } else {
      r.to(0)->recv(&w, sizeof w, 2, &a);  // tag 2: not what rank 0 sends
      r.to(0)->recv(&w, sizeof w, 5, &b);
    }
    ASSERT_TRUE(r.drive({&a, &b}, 10s));
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
    ASSERT_EQ(b.state, State::failed);
    EXPECT_EQ(b.failed_peer, 1 - r.rank) << b.error;
    if (r.rank == 0) {
      EXPECT_TRUE(has(b.error, "failed the connection on its side")) << b.error;
    } else {
      EXPECT_TRUE(has(b.error, "expected tag 2")) << b.error;
    }
  });
}

TEST(IbvTransport, ThePortGoingDownFailsEveryConnection) {
  ScopedEnv env({{"FAKEVERBS_ASYNC_PORT_ERR_AFTER_MS", "300"}});
  run_process_ranks(2, opts(2), ibverbs(), [](TransportRank& r) {
    r.handshake(1 - r.rank);
    std::uint64_t v = 0;
    bt::Request q;
    r.to(1 - r.rank)->recv(&v, sizeof v, 3, &q);
    ASSERT_TRUE(r.drive({&q}, 10s));
    ASSERT_EQ(q.state, State::failed);
    EXPECT_TRUE(has(q.error, "port") && has(q.error, "fakeverbs0:1")) << q.error;
  });
}

// --- GPU memory (GPUDirect RDMA) on the emulated GPU runtime ------------------------------

/// One emulated GPU runtime for these tests: its device memory is memfd-backed, so that a
/// dma-buf of it (a dup of the memfd) mapped by the provider aliases the device pointer.
braid::gpu::Runtime& emulated_gpu() {
  static const std::unique_ptr<braid::gpu::Runtime> rt = braid::gpu::make_emulated();
  return *rt;
}

/// The transport made directly (not through the entry, which takes the GPU from the
/// communicator), with GPU 0 of the emulated runtime and BRAID_GDR = `gdr`, sysfs at `sysfs`.
TransportFactory gpu_ibverbs(int gdr, std::string sysfs = "/nonexistent") {
  return [=](const bt::CommonOptions& c, bt::Poller& p, bt::PeerDirectory& d) {
    bt::IbvOptions o;
    static_cast<bt::CommonOptions&>(o) = c;
    o.library = BRAID_FAKEVERBS_LIBRARY;
    o.sysfs_root = sysfs;
    o.gpu = &emulated_gpu();
    o.gpu_device = 0;
    o.gdr = gdr;
    o.rndv_threshold = 1 << 20;  // so that small host messages go eagerly
    return bt::make_ibverbs_transport(o, p, d);
  };
}

/// A device buffer of `n` bytes holding `fill(k)` at byte k.
struct DeviceBytes {
  explicit DeviceBytes(std::size_t n) : bytes(n), p(static_cast<unsigned char*>(emulated_gpu().alloc_device(n, 0))) {}
  ~DeviceBytes() { emulated_gpu().free_device(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  std::size_t bytes;
  unsigned char* p;
};

/// Each way between two ranks: device-to-device messages of `sizes`, then rank 0 sends from
/// host memory into rank 1's device memory (eager and rendezvous), all checked; returns
/// the number of GPU receives the NIC wrote (those that need a flush).
std::size_t device_exchange(TransportRank& r, const std::vector<std::size_t>& sizes) {
  bt::Connection* c = r.to(1 - r.rank);
  EXPECT_TRUE(c->takes_device_memory());
  std::vector<std::unique_ptr<DeviceBytes>> out, in;
  std::vector<bt::Request> s(sizes.size()), q(sizes.size());
  std::vector<bt::Request*> all;
  std::size_t written = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(std::make_unique<DeviceBytes>(sizes[i]));
    in.push_back(std::make_unique<DeviceBytes>(sizes[i]));
    std::vector<unsigned char> h(sizes[i]);
    for (std::size_t k = 0; k < sizes[i]; ++k) h[k] = static_cast<unsigned char>(k * 13 + i + r.rank);
    emulated_gpu().copy(out[i]->p, h.data(), sizes[i]);
    std::memset(in[i]->p, 0xee, sizes[i]);
    c->recv_device(in[i]->p, sizes[i], 200 + i, &q[i]);
    written += sizes[i] > 0 ? 1 : 0;
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) c->send_device(out[i]->p, sizes[i], 200 + i, &s[i]);
  // Host to device: one eager, one by rendezvous.
  const std::vector<std::size_t> mixed = {3000, (1 << 20) + 100};
  std::vector<std::vector<unsigned char>> host(mixed.size());
  std::vector<std::unique_ptr<DeviceBytes>> landing;
  std::vector<bt::Request> m(mixed.size());
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    host[i].resize(mixed[i]);
    for (std::size_t k = 0; k < mixed[i]; ++k) host[i][k] = static_cast<unsigned char>(k * 5 + i);
    if (r.rank == 0) {
      c->send(host[i].data(), mixed[i], 300 + i, &m[i]);
    } else {
      landing.push_back(std::make_unique<DeviceBytes>(mixed[i]));
      c->recv_device(landing.back()->p, mixed[i], 300 + i, &m[i]);
    }
  }
  if (r.rank == 1) written += 1;  // the rendezvous one; the eager chunk is copied by the runtime
  for (std::size_t i = 0; i < sizes.size(); ++i) all.push_back(&s[i]), all.push_back(&q[i]);
  for (bt::Request& x : m) all.push_back(&x);
  EXPECT_TRUE(r.drive(all, 60s));
  for (bt::Request* x : all) EXPECT_EQ(x->state, State::done) << x->error;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t k = 0; k < sizes[i]; ++k) {
      if (in[i]->p[k] != static_cast<unsigned char>(k * 13 + i + 1 - r.rank)) {
        ADD_FAILURE() << "device message " << i << " byte " << k;
        break;
      }
    }
  }
  if (r.rank == 1) {
    for (std::size_t i = 0; i < mixed.size(); ++i)
      EXPECT_EQ(std::memcmp(landing[i]->p, host[i].data(), mixed[i]), 0) << "host-to-device message " << i;
  }
  return written;
}

TEST(IbvTransport, GpuBuffersGoStraightToTheNicThroughDmaBufAndAreFlushedBeforeTheDeviceReads) {
  // dma-buf: the provider maps the exported memfd itself, so a wrong offset or iova would
  // land the bytes elsewhere. Striped over 3 queue pairs too.
  const std::vector<std::size_t> sizes = {0, 1, 4096, 300000, (2 << 20) + 12345};
  const std::uint64_t before = emulated_gpu().rdma_flushes();
  std::atomic<std::size_t> written{0};
  run_thread_ranks(2, opts(2), gpu_ibverbs(-1), [&](TransportRank& r) {
    for (int round = 0; round < 2; ++round) written += device_exchange(r, sizes);
  });
  // One flush per GPU receive the NIC wrote, before it completed (thread ranks share the runtime).
  EXPECT_EQ(emulated_gpu().rdma_flushes() - before, written.load());
}

TEST(IbvTransport, WithoutDmaBufGpuBuffersGoThroughNvidiaPeermemOrAreLeftToTheEngine) {
  ScopedEnv env({{"FAKEVERBS_NO_DMABUF", "1"}});  // a kernel or HCA without dma-buf
  const std::string sysfs = temp_path("ibv-sysfs");
  ASSERT_EQ(::mkdir(sysfs.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((sysfs + "/module").c_str(), 0700), 0);
  // No nvidia-peermem: auto leaves GPU buffers to the engine's staging; BRAID_GDR=1 refuses.
  MemDirectory dir;
  RankDirectory d(dir, 0);
  {
    TransportRank r(d, common_options(0, 2, fresh_comm_id()), gpu_ibverbs(-1, sysfs));
    EXPECT_FALSE(r.to(1)->takes_device_memory());
  }
  {
    TransportRank r(d, common_options(0, 2, fresh_comm_id()), gpu_ibverbs(0));
    EXPECT_FALSE(r.to(1)->takes_device_memory()) << "BRAID_GDR=0";
  }
  try {
    TransportRank r(d, common_options(0, 2, fresh_comm_id()), gpu_ibverbs(1, sysfs));
    ADD_FAILURE() << "BRAID_GDR=1 made a transport without dma-buf or nvidia-peermem";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braid::ErrorCode::Unsupported);
    EXPECT_TRUE(has(e.what(), "BRAID_GDR=1") && has(e.what(), "nvidia-peermem") &&
                has(e.what(), "does not register dma-buf memory"))
        << e.what();
  }
  // nvidia-peermem loaded: device pointers registered with ibv_reg_mr.
  ASSERT_EQ(::mkdir((sysfs + "/module/nvidia_peermem").c_str(), 0700), 0);
  { std::ofstream((sysfs + "/module/nvidia_peermem/version").c_str()) << "1.0\n"; }
  run_thread_ranks(2, opts(2), gpu_ibverbs(1, sysfs),
                   [&](TransportRank& r) { device_exchange(r, {0, 100, 500000}); });
  ::unlink((sysfs + "/module/nvidia_peermem/version").c_str());
  ::rmdir((sysfs + "/module/nvidia_peermem").c_str());
  ::rmdir((sysfs + "/module").c_str());
  ::rmdir(sysfs.c_str());
}

}  // namespace

#else

TEST(IbvTransport, NeedsTheVerbsHeadersAndTheTestProvider) {
  GTEST_SKIP() << "built without the verbs headers (BRAID_WITH_IBVERBS; scripts/setup.sh installs libibverbs-dev)";
}

#endif
