// A keep-alive HTTP client pool for one target (an engine or the indexer): the router's adapter
// of cpp-httplib (its types and exceptions stop in engine_client.cc). Reusing connections keeps
// the router's added latency to a loopback round trip, not a TCP handshake per request.
//
// Threading: Call and Stream are thread-safe; each takes an idle connection from the pool (or
// opens one) and returns it when done. At most `max_idle` idle connections are kept.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "http/http_server.h"

namespace kvo::route {

class ClientPool {
 public:
  ClientPool(HttpAddress address, int timeout_ms, size_t max_idle = 64);
  ~ClientPool();
  ClientPool(const ClientPool&) = delete;
  ClientPool& operator=(const ClientPool&) = delete;

  const HttpAddress& address() const { return address_; }

  // One whole request. Unavailable when the target cannot be reached or the answer is cut;
  // any HTTP status is a successful call.
  Result<HttpClientResult> Call(const std::string& method, const std::string& path,
                                const std::string& body);

  // A POST whose answer is relayed as it arrives: `on_head(status, content_type)` once, before
  // any body byte, then `on_chunk` per piece of body; either returning false cancels (Cancelled).
  // Unavailable when the target cannot be reached or the answer is cut; the returned value is the
  // status.
  using OnHead = std::function<bool(int status, const std::string& content_type)>;
  using OnChunk = std::function<bool(std::string_view)>;
  Result<int> Stream(const std::string& path, const std::string& body, const OnHead& on_head,
                     const OnChunk& on_chunk);

 private:
  struct Impl;
  HttpAddress address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::route
