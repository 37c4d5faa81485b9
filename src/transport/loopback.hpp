// A rank's connection to itself: send/recv with the rank's own number as the peer (NCCL and
// MPI accept them; torch's batch_isend_irecv emits them). Not a registered transport: the
// engine adds it to every communicator and routes a rank's own number to it.
//
// Same contract as every Connection (transport.hpp): the n-th send is matched with the n-th
// receive, and a tag or size that differs fails both, saying what was posted. The copy
// happens when the second of a pair is posted, so a send completes only once its receive is
// posted: post both before waiting for either (as with NCCL's group calls).
#pragma once

#include "transport/common.hpp"

#include <cstring>
#include <deque>

namespace braid::transport {

class LoopbackTransport final : public Transport, private Connection {
 public:
  explicit LoopbackTransport(int rank) : rank_(rank) {}
  const char* name() const noexcept override { return "self"; }
  Connection* connection(int) override { return this; }
  bool progress() override { return false; }
  void close_all(const std::string& reason) override {
    broken_ = reason;
    for (auto* q : {&sends_, &recvs_}) {
      for (const Posted& p : *q) fail_request(p.req, reason, -1, false);
      q->clear();
    }
  }

 private:
  struct Posted {
    void* buf;
    std::size_t bytes;
    std::uint64_t tag;
    Request* req;
  };

  int peer() const noexcept override { return rank_; }
  void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override {
    check_post("self", "send", buf, bytes, req, rank_);
    post(sends_, {const_cast<void*>(buf), bytes, tag, req});
  }
  void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override {
    check_post("self", "recv", buf, bytes, req, rank_);
    post(recvs_, {buf, bytes, tag, req});
  }
  bool broken(std::string* why) const override {
    if (broken_.empty()) return false;
    if (why) *why = broken_;
    return true;
  }

  void post(std::deque<Posted>& q, const Posted& p) {
    start_request(p.req);
    if (!broken_.empty()) {
      fail_request(p.req, broken_, -1, false);
      return;
    }
    q.push_back(p);
    while (!sends_.empty() && !recvs_.empty()) {
      const Posted s = sends_.front(), r = recvs_.front();
      sends_.pop_front();
      recvs_.pop_front();
      if (s.tag != r.tag || s.bytes != r.bytes) {
        const std::string msg = "rank " + std::to_string(rank_) + " to itself: the receive expected tag " +
                                std::to_string(r.tag) + " and " + std::to_string(r.bytes) + " bytes, the send has tag " +
                                std::to_string(s.tag) + " and " + std::to_string(s.bytes) + " bytes";
        fail_request(s.req, msg, -1, false);
        fail_request(r.req, msg, -1, false);
        continue;
      }
      if (s.bytes > 0 && s.buf != r.buf) std::memmove(r.buf, s.buf, s.bytes);
      s.req->state = Request::State::done;
      r.req->state = Request::State::done;
    }
  }

  int rank_;
  std::deque<Posted> sends_, recvs_;
  std::string broken_;
};

}  // namespace braid::transport
