#include "tests/testing/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>

namespace kvo::testing {
namespace {

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
}

}  // namespace

RawHttpConn::RawHttpConn(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RawHttpConn::~RawHttpConn() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawHttpConn::Send(const std::string& data) {
  size_t off = 0;
  while (fd_ >= 0 && off < data.size()) {
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return fd_ >= 0;
}

void RawHttpConn::Reset() {
  if (fd_ < 0) return;
  linger l{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd_);
  fd_ = -1;
}

bool RawHttpConn::Readable() {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

bool RawHttpConn::ClosedWithin(int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, MsLeft(deadline)) <= 0) continue;
    if (::recv(fd_, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

RawHttpConn::Response RawHttpConn::Read(int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    size_t end = in_.find("\r\n\r\n");
    if (end != std::string::npos) {
      Response r;
      if (end >= 12) r.status = std::atoi(in_.substr(9, 3).c_str());
      std::string head = in_.substr(0, end);
      for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t len = 0;
      size_t cl = head.find("content-length:");
      if (cl != std::string::npos) len = std::strtoul(head.c_str() + cl + 15, nullptr, 10);
      if (in_.size() >= end + 4 + len) {
        r.body = in_.substr(end + 4, len);
        in_.erase(0, end + 4 + len);
        return r;
      }
    }
    if (fd_ < 0 || Clock::now() >= deadline) return {};
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, MsLeft(deadline)) <= 0) continue;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return {};
    in_.append(buf, static_cast<size_t>(n));
  }
}

std::string RawPost(const std::string& path, const std::string& body,
                    const std::string& extra_headers) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace kvo::testing
