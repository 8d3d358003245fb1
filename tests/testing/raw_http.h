// RawHttpConn: a TCP connection to 127.0.0.1:port for tests that attack an HTTP server byte by
// byte (slow headers, chunked bodies, pipelining), with every read bounded by a deadline.
#pragma once

#include <string>

namespace kvo::testing {

class RawHttpConn {
 public:
  explicit RawHttpConn(int port);  // !ok() when the connection is refused
  ~RawHttpConn();
  RawHttpConn(const RawHttpConn&) = delete;
  RawHttpConn& operator=(const RawHttpConn&) = delete;
  bool ok() const { return fd_ >= 0; }

  // False when the peer closed or reset.
  bool Send(const std::string& data);
  // Whether the server has sent something (or closed) by now.
  bool Readable();
  // Closes the connection with a reset (SO_LINGER 0), as a crashed client's kernel would.
  void Reset();
  // Whether the server closed the connection (EOF or reset) within `ms`.
  bool ClosedWithin(int ms);

  struct Response {
    int status = 0;  // 0: no complete response before the deadline
    std::string body;
  };
  // Reads one response (Content-Length framed; a 1xx has no body) within `ms`.
  Response Read(int ms);

 private:
  int fd_ = -1;
  std::string in_;
};

// "POST path HTTP/1.1" with a JSON body and its Content-Length.
std::string RawPost(const std::string& path, const std::string& body,
                    const std::string& extra_headers = "");

}  // namespace kvo::testing
