// TcpStore and TcpStoreServer with their TLS given rather than configured. The public
// constructors take it from BRAID_TLS (Config::global(), read once per process); these
// take a Context, so that one process can hold stores with and without TLS, or with
// different certificates (the tests do). Private to braid.
#pragma once

#include <braid/store.hpp>

#include "base/tls.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace braid::core {

/// As TcpStoreServer(bind_addr, port, token), with `tls` (null: plain TCP) in place of
/// BRAID_TLS. The other BRAID_STORE_* limits still come from the configuration.
std::unique_ptr<TcpStoreServer> make_store_server(const std::string& bind_addr, std::uint16_t port,
                                                  const std::string& token,
                                                  std::shared_ptr<const base::tls::Context> tls);

/// As TcpStore(host, port, is_server, connect_timeout, token), with `tls` (null: plain
/// TCP) in place of BRAID_TLS, for the connection and for a hosted server alike.
std::unique_ptr<TcpStore> make_store_client(const std::string& host, std::uint16_t port, bool is_server,
                                            std::chrono::milliseconds connect_timeout, const std::string& token,
                                            std::shared_ptr<const base::tls::Context> tls);

}  // namespace braid::core
