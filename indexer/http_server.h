// A small HTTP/1.1 server for the indexer's API: cpp-httplib behind a seam of plain structs, so
// the rest of the indexer never sees httplib types or exceptions (they stop in http_server.cc).
//
// Threading: Start() binds, then serves on an internal thread plus a small worker pool; handlers
// run on the workers, concurrently, and must be thread-safe. Stop() is idempotent and waits for
// the serving thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "indexer/sources_config.h"

namespace kvo {

struct HttpRequest {
  std::string method;  // "GET" | "POST" | ...
  std::string path;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

struct HttpServerOptions {
  HttpAddress address;  // port 0: any free port
  int worker_threads = 4;
  size_t max_body_bytes = 64u << 20;  // a larger request is refused (413)
  int read_timeout_s = 10;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds `options.address` and starts serving `handler` for every request (it dispatches on
  // method and path). Unavailable when the address cannot be bound, naming it.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                   Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A blocking HTTP client call (the C++ client and tests). Unavailable when the server cannot be
// reached; any HTTP status is a successful call.
struct HttpClientResult {
  int status = 0;
  std::string body;
};
Result<HttpClientResult> HttpCall(const HttpAddress& address, const std::string& method,
                                  const std::string& path, const std::string& body, int timeout_ms);

}  // namespace kvo
