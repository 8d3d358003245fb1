// libFuzzer target: every HTTP body of the indexer API, through the real handler
// (IndexerService::Handle, no sockets) of a service over a small index (sources "a" with 2 DP
// ranks and "b"; a 64-token prompt stored on GPU and CPU). The first input byte picks the route
// (POST /v1/score or /v1/explain); the rest is the body. Checks: never a crash or throw; the answer
// is 200 or 400 with a JSON body; a 400 is {"error": <bounded message>}; a 200 score parses back
// (ParseScoreResponse, the client's parser). ParseScoreRequest round-trips through
// RenderScoreRequest, and the client-side parsers (ParseScoreResponse, ParseErrorMessage) take the
// body as a response without crashing.
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "indexer/indexer.h"
#include "indexer/service/http_api.h"
#include "indexer/service/service.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::string g_root;
std::unique_ptr<kvo::IndexerService> g_service;
const std::set<std::string, std::less<>> kSources = {"a", "b"};

kvo::EventBatch Stored(const char* medium, int blocks) {
  kvo::BlockStored s;
  for (int i = 0; i < blocks; ++i) s.block_hashes.push_back(kvo::BlockHash::Uint(1000 + i));
  for (int64_t t = 0; t < 16 * blocks; ++t) s.token_ids.push_back(t);
  s.block_size = 16;
  s.medium = medium;
  kvo::EventBatch b;
  b.ts = 1.0;
  b.events.push_back(std::move(s));
  return b;
}

void Setup() {
  char tmpl[] = "/tmp/kvo-http-fuzz-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) std::abort();
  g_root = tmpl;
  const std::string db = g_root + "/index.db";
  {
    kvo::IndexerOptions io;
    io.background_thread = false;
    auto index = kvo::Indexer::Open(db, io);
    FUZZ_CHECK(index.ok(), "%s", index.status().ToString().c_str());
    FUZZ_CHECK((*index)->ApplyBatch("a", 0, 0, Stored("GPU", 4)).ok(), "apply");
    FUZZ_CHECK((*index)->ApplyBatch("a", 1, 0, Stored("CPU", 2)).ok(), "apply");
    FUZZ_CHECK((*index)->ApplyBatch("b", 0, 0, Stored("GPU", 1)).ok(), "apply");
    FUZZ_CHECK((*index)->Flush().ok(), "flush");
  }
  kvo::IndexerConfig config;
  config.db = db;
  config.max_query_tokens = 4096;
  config.sources.resize(2);
  config.sources[0].name = "a";
  config.sources[0].endpoint = "inproc://kvo-http-fuzz-a";
  config.sources[0].dp_ranks = 2;
  config.sources[1].name = "b";
  config.sources[1].endpoint = "inproc://kvo-http-fuzz-b";
  kvo::ServiceOptions options;
  options.start_http = false;
  auto service = kvo::IndexerService::Start(config, options);
  FUZZ_CHECK(service.ok(), "%s", service.status().ToString().c_str());
  g_service = std::move(service).value();
}

void CheckRoundTrip(std::string_view body) {
  kvo::ScoreRequestLimits limits;
  limits.max_query_tokens = 4096;
  kvo::Result<kvo::ScoreQuery> q = kvo::ParseScoreRequest(body, limits, kSources);
  if (!q.ok()) {
    FUZZ_CHECK(q.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               q.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(q.status().message());
    return;
  }
  const std::string again_text = kvo::RenderScoreRequest(*q);
  kvo::Result<kvo::ScoreQuery> again = kvo::ParseScoreRequest(again_text, limits, kSources);
  FUZZ_CHECK(again.ok(), "a rendered request does not parse: %s\n%s",
             again.status().ToString().c_str(), kvo_fuzz::Preview(again_text, 2000).c_str());
  FUZZ_CHECK(again->token_ids == q->token_ids && again->block_hashes == q->block_hashes &&
                 again->block_size == q->block_size && again->lora_name == q->lora_name &&
                 again->weights == q->weights && again->sources == q->sources,
             "request round trip changed the query\n%s\n%s", kvo_fuzz::Preview(body, 2000).c_str(),
             kvo_fuzz::Preview(again_text, 2000).c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  Setup();
  std::atexit([] {
    if (g_service) g_service->Stop();
    g_service.reset();
    std::error_code ec;
    std::filesystem::remove_all(g_root, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool explain = data[0] & 1;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);

  kvo::HttpRequest request{"POST", explain ? "/v1/explain" : "/v1/score", std::string(body)};
  kvo::HttpResponse response = g_service->Handle(request);
  FUZZ_CHECK(response.status == 200 || response.status == 400, "status %d: %s", response.status,
             kvo_fuzz::Preview(response.body).c_str());
  nlohmann::json j = nlohmann::json::parse(response.body, nullptr, false);
  FUZZ_CHECK(!j.is_discarded() && j.is_object(), "the body is not a JSON object: %s",
             kvo_fuzz::Preview(response.body).c_str());
  if (response.status == 400) {
    FUZZ_CHECK(j.contains("error") && j["error"].is_string(), "a 400 without an error");
    FUZZ_CHECK_MESSAGE(j["error"].get<std::string>());
    FUZZ_CHECK(kvo::ParseErrorMessage(response.body) == j["error"].get<std::string>(),
               "ParseErrorMessage");
  } else if (!explain) {
    kvo::Result<kvo::ScoreResult> parsed = kvo::ParseScoreResponse(response.body);
    FUZZ_CHECK(parsed.ok(), "a 200 score does not parse: %s\n%s",
               parsed.status().ToString().c_str(), kvo_fuzz::Preview(response.body, 2000).c_str());
  } else {
    FUZZ_CHECK(j.contains("score") && j.contains("blocks"), "explain without score or blocks");
    kvo::Result<kvo::ScoreResult> parsed = kvo::ParseScoreResponse(j["score"].dump());
    FUZZ_CHECK(parsed.ok(), "explain's score does not parse: %s",
               parsed.status().ToString().c_str());
  }

  CheckRoundTrip(body);
  // The client's parsers, given the body as if a server had answered it.
  kvo::Result<kvo::ScoreResult> as_response = kvo::ParseScoreResponse(body);
  if (!as_response.ok()) FUZZ_CHECK_MESSAGE(as_response.status().message());
  (void)kvo::ParseErrorMessage(body);
  return 0;
}
