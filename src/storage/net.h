// TCP helpers for the storage service: listen/connect with timeouts, exact reads, vectored
// writes (never SIGPIPE), and HOST:PORT parsing. Errors name the peer. Internal to storage/.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom::storage::net {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> parse_host_port(std::string_view s);

// A listening socket on host:port (port 0: any free port); *bound_port receives the port.
Result<int> listen_tcp(const HostPort& where, int backlog, uint16_t* bound_port);
Result<int> connect_tcp(const HostPort& where, int timeout_ms);
// Send/receive timeouts (0: none) and TCP_NODELAY.
Status configure(int fd, int io_timeout_ms);

// Reads exactly n bytes; a clean EOF before the first byte is kUnavailable("closed").
Status recv_exact(int fd, void* data, size_t n, std::string_view peer);
// Writes every byte of every iovec (the array is modified while progressing).
Status send_all(int fd, std::span<iovec> iov, std::string_view peer);
// Discards n bytes (a frame the receiver cannot use, read to stay in sync).
Status discard(int fd, uint64_t n, std::string_view peer);

}  // namespace fathom::storage::net
