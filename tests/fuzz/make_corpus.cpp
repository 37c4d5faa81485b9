// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): real messages
// and files made by the production encoders (the transports' hellos and headers, TcpStore
// frames, a FileStore file, a saved error-feedback checkpoint, the default cost model,
// encoded codec payloads), each behind the mode bytes its target reads first.
//   build-fuzz/tests/fuzz/make_corpus tests/fuzz/corpus
// The seeds are committed; rerun this after a format changes (docs/reliability.md).
#include "collectives/cost.hpp"
#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"
#include "core/store_wire.hpp"
#include "transport/ibverbs/ibv_record.hpp"
#include "transport/ibverbs/ibv_wire.hpp"
#include "transport/shm/shm_wire.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/ucx/ucx_wire.hpp"

#include <braid/store.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace {

std::string root;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = root + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

std::string u8(unsigned v) { return std::string(1, static_cast<char>(v)); }
std::string bytes_of(const std::vector<unsigned char>& v) { return std::string(v.begin(), v.end()); }

// The identity the fuzz targets authenticate against (their kComm, kToken).
constexpr std::uint64_t kComm = 0x0123456789abcdefull;
const std::string kToken = "job-token";

void tcp() {
  namespace w = braid::transport::tcp_wire;
  w::Hello h;
  h.socket_index = 0;
  h.sockets_per_peer = 2;
  h.token_bytes = static_cast<std::uint16_t>(kToken.size());
  h.from_rank = 1;
  h.to_rank = 5;
  h.comm_id = kComm;
  const std::string hello = w::hello_bytes(h, kToken);
  seed("tcp_wire", "hello", u8(1) + hello);
  // The hello, then message 0 (0 bytes, tag 3) and message 1 (1 byte, tag 980), one socket.
  std::string s = u8(0) + hello;
  const std::size_t sizes[] = {0, 1};
  for (std::uint64_t seq = 0; seq < 2; ++seq) {
    w::PartHeader p;
    p.seq = seq;
    p.tag = seq * 977 + 3;
    p.msg_bytes = p.part_bytes = sizes[seq];
    unsigned char b[w::kPartHeaderBytes];
    w::encode(p, b);
    s.append(reinterpret_cast<const char*>(b), sizeof b);
    s.append(sizes[seq], 'x');
  }
  seed("tcp_wire", "hello_two_messages", s);
}

void shm() {
  namespace w = braid::transport::shm_wire;
  w::Hello h;
  h.token_bytes = static_cast<std::uint16_t>(kToken.size());
  h.from_rank = 0;
  h.to_rank = 2;
  h.slots = 8;
  h.comm_id = kComm;
  h.slot_bytes = 4 * w::kPage;
  seed("shm_wire", "hello", u8(0) + w::hello_bytes(h, kToken, ""));
  h.status = w::kStatusFailed;
  const std::string why = "cannot create the segment";
  h.reason_bytes = static_cast<std::uint16_t>(why.size());
  seed("shm_wire", "hello_failed", u8(0) + w::hello_bytes(h, kToken, why));
  // An ack, then the slot of message 0 (0 bytes, tag 1) and message 1 (1 byte, tag 32).
  std::string s = u8(1) + w::ack_bytes(w::Ack{}, "");
  for (std::uint64_t seq = 0; seq < 2; ++seq) {
    w::SlotHeader sh{};
    sh.seq = seq;
    sh.tag = seq * 31 + 1;
    sh.msg_bytes = sh.part_bytes = seq;
    sh.kind = w::kKindInline;
    s.append(reinterpret_cast<const char*>(&sh), sizeof sh);
  }
  seed("shm_wire", "ack_two_slots", s);
  // hi mapped the device ring: an ack with the flag, then a part in a device slot.
  w::Ack ring;
  ring.flags = w::kAckDeviceRing;
  std::string d = u8(1) + w::ack_bytes(ring, "");
  w::SlotHeader dh{};
  dh.tag = 1;
  dh.kind = w::kKindDevice;
  d.append(reinterpret_cast<const char*>(&dh), sizeof dh);
  seed("shm_wire", "ack_device_ring", d);
  w::Ack refused;
  refused.status = w::kStatusFailed;
  refused.reason_bytes = 7;
  seed("shm_wire", "ack_refused", u8(1) + w::ack_bytes(refused, "refused"));
}

void ucx() {
  namespace w = braid::transport::ucx_wire;
  const std::vector<unsigned char> addr = {0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80};
  w::Control h;
  h.kind = w::kHello;
  h.comm_id = kComm;
  h.from = 1;
  h.to = 3;
  h.session = 77;
  seed("ucx_wire", "hello", u8(1 << 1) + bytes_of(w::encode_control(h, kToken, addr)));
  h.kind = w::kRefusal;
  h.echo = 77;
  seed("ucx_wire", "refusal", u8(1 << 1) + bytes_of(w::encode_control(h, kToken, {})));
  h.kind = w::kBye;
  h.echo = 12;
  seed("ucx_wire", "bye", u8(1 << 1) + bytes_of(w::encode_control(h, kToken, {})));
  seed("ucx_wire", "address_hex", u8(1) + "102030405060708090a0b0c0d0e0f0ff");
}

void ibv_record() {
  namespace ib = braid::transport::ibverbs;
  ib::ConnRecord r;
  r.comm_id = kComm;
  r.from = 1;
  r.to = 5;
  r.token = kToken;
  r.lid = 0x12;
  r.mtu = 3;
  r.qpn = 0x1a2b3c;
  r.psn = 0x000777;
  r.ring_addr = 0x7f0000001000ull;
  r.ring_rkey = 0x1234;
  r.slots = 64;
  r.slot_bytes = 1u << 16;
  r.ctrl_addr = 0x7f0000800000ull;
  r.ctrl_rkey = 0x5678;
  r.ctrl_bytes = 4096;
  seed("ibv_record", "infiniband", ib::encode_record(r));
  r.ethernet = true;
  r.lid = 0;
  r.mtu = 5;
  const unsigned char gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
  for (int i = 0; i < 16; ++i) r.gid[static_cast<std::size_t>(i)] = gid[i];
  seed("ibv_record", "roce", ib::encode_record(r));
  r.data_qpns = {0x1a2b3d, 0x1a2b3e, 0x1a2b3f};  // BRAID_IB_QPS_PER_PEER=4
  seed("ibv_record", "roce_4qps", ib::encode_record(r));
}

void store() {
  namespace sw = braid::core::store_wire;
  auto req = [](sw::Op op, std::uint32_t id) {
    sw::Encoder e;
    e.u8(op);
    e.u32(id);
    return e;
  };
  // A hello with a token, then its proof (fixed bytes: the server's nonce varies anyway).
  std::string all = sw::hello_bytes(true, std::string(16, 'n')) + std::string(sw::kClientProofSize, 'p');
  {
    auto e = req(sw::kSet, 1);
    e.str("key");
    e.str("value");
    all += e.finish();
  }
  {
    auto e = req(sw::kGet, 2);
    e.str("key");
    e.u64(1000);
    all += e.finish();
  }
  {
    auto e = req(sw::kAdd, 3);
    e.str("counter");
    e.u64(static_cast<std::uint64_t>(-5));
    all += e.finish();
  }
  {
    auto e = req(sw::kCheck, 4);
    e.u32(2);
    e.str("a");
    e.str("b");
    all += e.finish();
  }
  {
    auto e = req(sw::kWait, 5);
    e.u32(1);
    e.str("a");
    e.u64(50);
    all += e.finish();
  }
  {
    auto e = req(sw::kRemove, 6);
    e.str("key");
    all += e.finish();
  }
  {
    auto e = req(sw::kCompareSet, 7);
    e.str("shrink/0/members");
    e.str("");
    e.str("0,1,3");
    all += e.finish();
  }
  seed("store_server", "every_request", u8(0) + all);

  // Replies (the client's input): OK with a value, an i64, a flag, a WAIT timeout with
  // the missing keys, an error message. The target reads a piece-size byte first.
  auto reply = [](sw::Status s, std::uint32_t id) {
    sw::Encoder e;
    e.u8(s);
    e.u32(id);
    return e;
  };
  std::string r;
  {
    auto e = reply(sw::kOk, 2);
    e.str("value");
    r += e.finish();
  }
  {
    auto e = reply(sw::kOk, 3);
    e.u64(42);
    r += e.finish();
  }
  {
    auto e = reply(sw::kOk, 4);
    e.u8(1);
    r += e.finish();
  }
  {
    auto e = reply(sw::kTimeout, 5);
    e.u32(1);
    e.str("a");
    r += e.finish();
  }
  {
    auto e = reply(sw::kFailed, 7);
    e.str("the value of 'counter' is not a decimal integer");
    r += e.finish();
  }
  seed("store_client", "replies", u8(255) + r);
}

void file_store() {
  const std::string path = "/tmp/braid-make-corpus-" + std::to_string(::getpid());
  ::unlink(path.c_str());
  {
    braid::FileStore fs(path);
    fs.set("a", "1");
    fs.set("b", "hello");
    fs.add("n", 7);
    fs.remove("b");
  }
  std::ifstream f(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ::unlink(path.c_str());
  seed("file_store", "real_file", u8(1) + file);          // raw: the file as it is
  seed("file_store", "records", u8(0) + file.substr(16));  // behind the target's header
}

void error_feedback() {
  braid::compression::ErrorFeedbackStore s;
  float* w = s.residual("bucket0", braid::compression::ResidualRole::worker, 4);
  w[0] = 1.5f;
  w[3] = -2.0f;
  s.residual("bucket1", braid::compression::ResidualRole::owner, 2)[1] = 0.25f;
  for (int i = 0; i < 3; ++i) s.next_step("bucket0");  // version 2's step counters
  s.next_step("bucket1");
  std::ostringstream os;
  s.save(os);
  seed("error_feedback", "checkpoint", u8(0) + os.str());
  // Without its checksum, which the target then appends (mode bit 0).
  seed("error_feedback", "checkpoint_unsummed", u8(1) + os.str().substr(0, os.str().size() - 8));
}

void cost_model() {
  seed("cost_model", "defaults", braid::collectives::serialize(braid::collectives::CostModel::defaults()) + "\n");
}

void codec() {
  namespace cz = braid::compression;
  // The target's header: kind, block/8 - 1, rounding, ratio*256 - 1, count (u16), framed.
  const char* names[] = {"none", "fp16",  "bf16",  "fp8e4m3", "fp8e5m2",
                         "int8", "int4",  "sign1", "mxfp8",   "mxfp4", "topk:0.25"};
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.5f;
  for (const char* n : names) {
    cz::CodecSpec spec = cz::parse_codec(n);
    spec.block = 32;
    std::vector<std::uint8_t> out(cz::encoded_bytes(spec, x.size()));
    cz::encode(spec, x.data(), x.size(), out.data());
    std::string s;
    s += u8(static_cast<unsigned>(spec.kind));
    s += u8(32 / 8 - 1);
    s += u8(0);
    s += u8(63);  // ratio 64/256
    s += u8(x.size() & 0xff) + u8(x.size() >> 8);
    s += u8(0);
    s.append(out.begin(), out.end());
    std::string file = n;
    for (char& c : file)
      if (c == ':' || c == '.') c = '_';
    seed("codec", file, s);
  }
}

void unique_id() {
  seed("unique_id", "id", "braid-uid-1 10.1.2.3 29500 1f2e3d4c5b6a7988a0b1c2d3");
}

}  // namespace

// The verbs transport's RDMA-written words: two size bytes, a data slot header, a CTS entry.
void ibv_wire() {
  namespace iw = braid::transport::ibverbs::wire;
  unsigned char h[iw::kHeaderBytes] = {}, c[iw::kCtsBytes] = {};
  iw::SlotHeader sh;
  sh.kind = iw::kData;
  sh.chunk = 100;
  sh.total = 100;
  iw::put_header(h, sh);
  iw::Cts cts;
  cts.addr = 0x7f0000001000ull;
  cts.rkey = 7;
  cts.bytes = 1 << 20;
  cts.seq = 1;
  iw::put_cts(c, cts);
  seed("ibv_wire", "data_and_cts", u8(0x10) + u8(0) + std::string(reinterpret_cast<char*>(h), sizeof h) +
                                       std::string(reinterpret_cast<char*>(c), sizeof c) + u8(3));
}

// Store records, each behind its selector byte (fuzz_store_records.cpp).
void store_records() {
  seed("store_records", "meta_token", u8(0) + "123456789abcdef\ntoken 0123456789abcdef0123456789abcdef");
  seed("store_records", "meta_given", u8(0) + "abc\ngiven");
  seed("store_records", "split", u8(1) + "3 -7");
  seed("store_records", "codec_rates", u8(2) + "int8 0x1.8p+30 0x1p+31\nfp16 0x1p+32 0x1p+32\n");
  seed("store_records", "addr", u8(3) + "10.99.0.1:41234");
}

// Environment lines (fuzz_config.cpp).
void config() {
  seed("config", "typical",
       "BRAID_TIMEOUT=30s\nBRAID_CODEC=int8\nBRAID_CHUNK_BYTES=1M\nBRAID_RANK=1\nBRAID_WORLD_SIZE=4\n"
       "BRAID_IB_HCA=mlx5_0:1,mlx5_1\nBRAID_IB_ADDR_RANGE=10.0.0.0/8\nBRAID_STORE_MAX_KEYS=100\n");
  seed("config", "torchrun", "RANK=0\nWORLD_SIZE=2\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nLOCAL_RANK=0\n");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  ::mkdir(root.c_str(), 0755);
  tcp();
  shm();
  ucx();
  ibv_record();
  store();
  store_records();
  ibv_wire();
  config();
  file_store();
  error_feedback();
  cost_model();
  codec();
  unique_id();
  return 0;
}
