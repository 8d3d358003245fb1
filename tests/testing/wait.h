// Small helpers shared by tests that drive real sockets and threads.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

namespace kvo::testing {

// Polls `cond` every 10 ms until it holds or 30 s have passed; the last answer is returned (so a
// failing EXPECT reports the state at the deadline). A bounded wait for an observable condition,
// not a sleep standing in for synchronisation.
inline bool Eventually(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// Binds a TCP socket to 127.0.0.1:`port` (0: any) and closes it; returns the port it got, 0 when
// the bind failed.
inline int BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// Records `port` as handed out by this process; false when it was already. The kernel often hands
// a just-closed ephemeral port out again, so two FreePort() calls whose ports nobody bound yet
// could return the same port (a test registering ten sources on "free" ports then saw two share
// an endpoint: 409).
inline bool ClaimPort(int port) {
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  return given.insert(port).second;
}

// A loopback TCP port that was free a moment ago and that this process has not handed out
// before (0 if none could be bound).
inline int FreePort() {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = BindLoopback(0);
    if (port == 0) return 0;
    if (ClaimPort(port)) return port;
  }
  return 0;
}

// A loopback TCP port whose successor was free too (an endpoint and its replay endpoint); 0 when
// 200 attempts found none.
inline int FreePortPair() {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = FreePort();
    if (port != 0 && port < 65000 && BindLoopback(port + 1) == port + 1 && ClaimPort(port + 1)) {
      return port;
    }
  }
  return 0;
}

}  // namespace kvo::testing
