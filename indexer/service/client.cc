#include "indexer/service/client.h"

#include "http/http_server.h"

namespace kvo {

Result<IndexerClient> IndexerClient::Create(std::string_view host_port, int timeout_ms) {
  KVO_ASSIGN_OR_RETURN(HttpAddress address, ParseHttpAddress(host_port));
  if (address.port == 0) {
    return Status::InvalidArgument("indexer address '" + std::string(host_port) +
                                   "': port 0 cannot be dialled");
  }
  return IndexerClient(std::move(address), timeout_ms);
}

Result<std::string> IndexerClient::Call(const std::string& method, const std::string& path,
                                        const std::string& body) const {
  KVO_ASSIGN_OR_RETURN(HttpClientResult r, HttpCall(address_, method, path, body, timeout_ms_));
  if (r.status == 200) return r.body;
  std::string what = ParseErrorMessage(r.body);
  std::string where = method + " " + path + ": HTTP " + std::to_string(r.status) + ": " + what;
  if (r.status == 400) return Status::InvalidArgument(where);
  if (r.status == 404 || r.status == 405) return Status::NotFound(where);
  return Status::Unavailable(where);
}

Result<ScoreResult> IndexerClient::Score(const ScoreQuery& query) const {
  KVO_ASSIGN_OR_RETURN(std::string body, ScoreJson(query));
  return ParseScoreResponse(body);
}

Result<std::string> IndexerClient::ScoreJson(const ScoreQuery& query) const {
  return Call("POST", "/v1/score", RenderScoreRequest(query));
}

Result<std::string> IndexerClient::ExplainJson(const ScoreQuery& query) const {
  return Call("POST", "/v1/explain", RenderScoreRequest(query));
}

Result<std::string> IndexerClient::SourcesJson() const { return Call("GET", "/v1/sources", ""); }

Result<std::string> IndexerClient::MetricsText() const { return Call("GET", "/metrics", ""); }

Status IndexerClient::Health() const {
  auto r = Call("GET", "/healthz", "");
  return r.ok() ? Status::Ok() : r.status();
}

}  // namespace kvo
