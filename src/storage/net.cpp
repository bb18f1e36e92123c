// TCP plumbing for the storage server and client.
#include "storage/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "base/strings.h"

namespace fathom::storage::net {

Result<HostPort> parse_host_port(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return invalid_argument("address '{}': expected HOST:PORT", s);
  }
  HostPort hp;
  hp.host = std::string(s.substr(0, colon));
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  auto port = parse_uint(s.substr(colon + 1), fmt::format("port of '{}'", s));
  if (!port.ok()) return port.status();
  if (*port > 65535) return invalid_argument("address '{}': port {} out of range", s, *port);
  hp.port = static_cast<uint16_t>(*port);
  return hp;
}

namespace {

Result<addrinfo*> resolve(const HostPort& where, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(where.port);
  const int rc = getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return unavailable("resolve '{}:{}': {}", where.host, where.port, gai_strerror(rc));
  return res;
}

}  // namespace

Result<int> listen_tcp(const HostPort& where, int backlog, uint16_t* bound_port) {
  addrinfo* res = TRY(resolve(where, true));
  Status last = unavailable("listen on '{}:{}': no address", where.host, where.port);
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) break;
    last = errno_status(errno, fmt::format("listen on '{}:{}'", where.host, where.port));
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return last;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

Result<int> connect_tcp(const HostPort& where, int timeout_ms) {
  addrinfo* res = TRY(resolve(where, false));
  Status last = unavailable("connect to {}:{}: no address", where.host, where.port);
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms);
      if (rc == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (rc == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc == 0) break;
    const int err = errno;
    last = Status(err == ECONNREFUSED || err == ETIMEDOUT ? StatusCode::kUnavailable : StatusCode::kIoError,
                  fmt::format("connect to {}:{}: {}", where.host, where.port, std::strerror(err)));
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return last;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Status configure(int fd, int io_timeout_ms) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{};
  tv.tv_sec = io_timeout_ms / 1000;
  tv.tv_usec = (io_timeout_ms % 1000) * 1000;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return errno_status(errno, "setsockopt timeouts");
  }
  return {};
}

Status recv_exact(int fd, void* data, size_t n, std::string_view peer) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (done == 0) return unavailable("{} closed the connection", peer);
      return unavailable("{} closed the connection mid-message ({} of {} bytes)", peer, done, n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return timeout_error("{}: receive timed out", peer);
    return errno_status(errno, fmt::format("receive from {}", peer));
  }
  return {};
}

Status send_all(int fd, std::span<iovec> iov, std::string_view peer) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return timeout_error("{}: send timed out", peer);
      return Status(errno == EPIPE || errno == ECONNRESET ? StatusCode::kUnavailable : StatusCode::kIoError,
                    fmt::format("send to {}: {}", peer, std::strerror(errno)));
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0 && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        iov[first].iov_len = 0;
        ++first;
      } else {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
  return {};
}

Status discard(int fd, uint64_t n, std::string_view peer) {
  char buf[65536];
  while (n > 0) {
    const size_t k = std::min<uint64_t>(n, sizeof(buf));
    TRY(recv_exact(fd, buf, k, peer));
    n -= k;
  }
  return {};
}

}  // namespace fathom::storage::net
