// A small HTTP/1.1 server and client (kvo_http: the indexer's API, `kvo sim`, `kvo route`, `kvo
// load`) behind a seam of plain structs, so the rest of kvo never sees the HTTP libraries' types or
// exceptions (they stop in http_server.cc).
//
// Model (Boost.Beast on Boost.Asio, indexer/DESIGN.md "HTTP server"): one I/O thread accepts and
// reads every connection asynchronously, so a slow or idle client holds a socket, never a thread.
// Each request is read under deadlines (the whole header, then the whole body); a kept-alive
// connection waiting for its next request is closed after `keep_alive_timeout_ms`. A complete
// request is handed to a bounded worker pool (`priority_paths`, e.g. /healthz, to a lane of its
// own), so a slow handler never delays reading or answering other connections; the worker writes
// the answer itself (a remainder the socket does not take at once goes through the I/O thread).
// One descriptor is kept in reserve so that `accept` works when the process runs out. Bodies are
// bounded per request (`max_body_bytes`, chunked or not) and together (`max_body_bytes_in_flight`);
// connections are bounded (`max_connections`). Every refusal is a JSON {"error"} body.
//
// Streaming (http/DESIGN.md): a handler may answer with `HttpResponse::stream` set; the header goes
// out with `Transfer-Encoding: chunked` and the producer then runs on the same worker, writing
// body chunks one by one (e.g. Server-Sent Events, `text/event-stream`). Each chunk is written
// under `write_timeout_ms`; a write returns false once the client is gone or the server stops,
// and the producer should then return. A streaming response holds its worker until it ends:
// size `worker_threads` for the streams served at once.
//
// Threading: handlers run on the workers, concurrently, and must be thread-safe. Stop() is
// idempotent: it closes every connection, waits for running handlers and joins every thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "http/address.h"

namespace kvo {

class ArrivingBody;

struct HttpRequest {
  std::string method;  // "GET" | "POST" | ...
  std::string path;    // without the query string
  std::string body;    // whatever its Content-Type (curl -d sends form-encoded JSON)
  // Set only for a request to one of HttpServerOptions::arriving_paths whose body was still being
  // read when the handler started: `body` is then empty and the handler reads the body through
  // this (valid while the handler runs). WholeBody(r) reads either.
  const ArrivingBody* arriving = nullptr;
};

// A request body the I/O thread is still reading while the handler runs (arriving_paths).
class ArrivingBody {
 public:
  virtual ~ArrivingBody() = default;
  // The body's storage: size() bytes (its Content-Length) once complete; only the first bytes
  // WaitBeyond reported may be read.
  virtual const char* data() const = 0;
  virtual size_t size() const = 0;
  // Blocks until more than `have` bytes are in place or the body ends; returns how many are in
  // place: size() once it is complete, `have` or fewer only when it never will be (the client went
  // away: whatever the handler answers is dropped).
  virtual size_t WaitBeyond(size_t have) const = 0;
};

// The whole body of `r`, waiting for one still arriving; nullopt when it never arrives.
std::optional<std::string_view> WholeBody(const HttpRequest& r);

// Writes one chunk of a streamed body (empty: nothing written). False once the client is gone, a
// write timed out or the server is stopping: the producer should stop.
using ChunkWriter = std::function<bool(std::string_view)>;

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int s, std::string type, std::string b)
      : status(s), content_type(std::move(type)), body(std::move(b)) {}

  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // Set: the body is streamed (chunked) by this producer, on the worker, and `body` is ignored.
  std::function<void(const ChunkWriter&)> stream;
  // Set: run on the worker once the answer is handed to the socket (or dropped with its
  // connection), before the request and its body are freed. For a handler's cleanup that need not
  // delay the answer: a helper thread that may still be reading the body or the handler's buffers
  // (the indexer's /query, indexer/DESIGN.md "A helper that stalls").
  std::function<void()> after_sent;

  // An SSE stream: content type text/event-stream.
  static HttpResponse Stream(std::function<void(const ChunkWriter&)> producer,
                             std::string content_type = "text/event-stream") {
    HttpResponse r;
    r.content_type = std::move(content_type);
    r.stream = std::move(producer);
    return r;
  }
};

struct HttpServerOptions {
  HttpAddress address;  // port 0: any free port
  int worker_threads = 4;
  // Requests read and not yet answered, across the workers; more: 503.
  int max_pending_requests = 256;
  // Served by one thread of their own, so a flood of slow requests cannot starve a liveness probe.
  std::vector<std::string> priority_paths = {"/healthz"};
  size_t max_body_bytes = 64u << 20;             // a larger body (chunked or not): 413
  size_t max_body_bytes_in_flight = 256u << 20;  // bodies being read or handled, together: 503
  size_t max_header_bytes = 16u << 10;           // request line + headers: 431
  int max_connections = 512;                     // more are answered 503 and closed
  int header_timeout_ms = 5000;                  // the whole header of a connection's first request
  int body_timeout_ms = 30000;                   // the whole body, from the end of the header
  int keep_alive_timeout_ms = 5000;  // an idle kept-alive connection: the next whole header
  int write_timeout_ms = 30000;      // the whole response
  // Requests to these paths with a Content-Length body of 64 KiB or more go to a worker as soon
  // as their header is read: the worker follows the body as the I/O thread reads it (pulling each
  // piece into its own cache) and runs the handler once it is complete, so the hand-off and the
  // handler's first pass over a cold body overlap the transfer (an 820 kB /query). The handler
  // still sees a complete body. Such a request holds a worker while its body arrives, so at most
  // `max_early_requests` are followed at once (a slow sender cannot take every worker); others
  // are read first, as on any other path.
  std::vector<std::string> early_paths;
  int max_early_requests = 1;
  // Of early_paths: here the handler itself runs while the body arrives (HttpRequest::arriving set,
  // `body` empty) and reads it as it lands, e.g. a /query's token list parsed during its transfer.
  // Its answer goes out once the whole body is in, whatever the handler read of it.
  std::vector<std::string> arriving_paths;
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
  // Requests handed to a worker while their body was still arriving (early_paths), so far.
  uint64_t followed_bodies() const;
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

// As HttpCall, but the body is handed to `on_chunk` as it arrives (whatever the status; the
// result's `body` stays empty), so a caller can time the first byte of a streamed answer.
// `on_chunk` returning false ends the call (Cancelled). `timeout_ms` bounds the connection and
// each read, not the whole stream.
using ChunkReceiver = std::function<bool(std::string_view)>;
Result<HttpClientResult> HttpStreamCall(const HttpAddress& address, const std::string& method,
                                        const std::string& path, const std::string& body,
                                        int timeout_ms, const ChunkReceiver& on_chunk);

// "http://HOST:PORT[/...]" or "HOST:PORT" -> the address (path ignored). InvalidArgument naming
// the text.
Result<HttpAddress> ParseHttpUrl(std::string_view url);

}  // namespace kvo
