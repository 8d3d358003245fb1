// A small C++ client of the indexer's HTTP API (`kvo index query`, routers written in C++).
// Thread-compatible: one call at a time per client; each call opens its own connection.
#pragma once

#include <string>
#include <string_view>

#include "common/result.h"
#include "indexer/service/http_api.h"
#include "indexer/service/sources_config.h"

namespace kvo {

class IndexerClient {
 public:
  // `host_port`: "HOST:PORT" (as ParseHttpAddress).
  static Result<IndexerClient> Create(std::string_view host_port, int timeout_ms = 5'000);

  // POST /v1/score. A 400 answer is InvalidArgument carrying the server's message.
  Result<ScoreResult> Score(const ScoreQuery& query) const;
  // The raw JSON bodies of /v1/score, /v1/explain, /v1/sources, /metrics.
  Result<std::string> ScoreJson(const ScoreQuery& query) const;
  Result<std::string> ExplainJson(const ScoreQuery& query) const;
  Result<std::string> SourcesJson() const;
  Result<std::string> MetricsText() const;
  // GET /healthz answered 200.
  Status Health() const;

 private:
  IndexerClient(HttpAddress address, int timeout_ms)
      : address_(std::move(address)), timeout_ms_(timeout_ms) {}
  Result<std::string> Call(const std::string& method, const std::string& path,
                           const std::string& body) const;

  HttpAddress address_;
  int timeout_ms_;
};

}  // namespace kvo
