// libFuzzer target: discovery's parsers of a vLLM API server's answers, GET /kv_event_sources
// (kvo::ParseKvEventSources) and GET /v1/models (ParseFirstModel), on arbitrary text, with the
// discovery host "10.0.0.7". Checks: never a crash or throw; an error is InvalidArgument with a
// bounded message; an accepted answer lists at most 1024 sources, ranks distinct and ascending,
// each with a non-empty endpoint in which no wildcard host is left (it names the discovery host
// instead); an accepted model id is non-empty and at most 4096 bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "indexer/service/discovery.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool Wildcard(const std::string& endpoint) {
  for (const char* w : {"tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:", "tcp://:::", "tcp://[*]:"}) {
    // Only a wildcard host with a port after it is rewritten (tcp://*: with no further colon).
    if (endpoint.starts_with(w) &&
        endpoint.find(':', std::string_view(w).size()) == std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto sources = kvo::ParseKvEventSources(body, "10.0.0.7");
  if (!sources.ok()) {
    FUZZ_CHECK(sources.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               sources.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(sources.status().message());
  } else {
    FUZZ_CHECK(sources->size() <= 1024, "%zu sources", sources->size());
    for (size_t i = 0; i < sources->size(); ++i) {
      const kvo::DiscoveredSource& s = (*sources)[i];
      FUZZ_CHECK(s.dp_rank >= 0, "rank %lld", static_cast<long long>(s.dp_rank));
      FUZZ_CHECK(i == 0 || (*sources)[i - 1].dp_rank < s.dp_rank, "ranks not ascending at %zu", i);
      FUZZ_CHECK(!s.endpoint.empty(), "empty endpoint at %zu", i);
      FUZZ_CHECK(!Wildcard(s.endpoint), "wildcard left in %s",
                 kvo_fuzz::Preview(s.endpoint).c_str());
      FUZZ_CHECK(!s.replay_endpoint || !Wildcard(*s.replay_endpoint), "wildcard left in %s",
                 kvo_fuzz::Preview(*s.replay_endpoint).c_str());
      FUZZ_CHECK(!s.replay_endpoint || !s.replay_endpoint->empty(), "empty replay endpoint");
      FUZZ_CHECK(s.topic.size() <= 1024, "topic of %zu bytes", s.topic.size());
    }
  }
  auto model = kvo::ParseFirstModel(body);
  if (!model.ok()) {
    FUZZ_CHECK(model.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               model.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(model.status().message());
  } else {
    FUZZ_CHECK(!model->empty() && model->size() <= 4096, "model id of %zu bytes", model->size());
  }
  return 0;
}
