// libFuzzer target: kvo::ParseIndexerConfig (`kvo index serve --config FILE`) on arbitrary text.
// Never a crash or throw; an error is InvalidArgument with a bounded message. An accepted config
// passes ValidateSources, has a parseable HTTP address and sane bounds, and expands every source
// into exactly dp_ranks streams with distinct endpoints.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "indexer/service/sources_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kvo::Result<kvo::IndexerConfig> c = kvo::ParseIndexerConfig(input, "indexer.json");
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               c.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(c.status().message());
    return 0;
  }
  kvo::Status valid = kvo::ValidateSources(c->sources);
  FUZZ_CHECK(valid.ok(), "accepted sources do not validate: %s", valid.ToString().c_str());
  FUZZ_CHECK(kvo::ParseHttpAddress(c->http).ok(), "http '%s'", c->http.c_str());
  FUZZ_CHECK(c->max_query_tokens > 0 && c->default_block_size > 0 && c->replay_timeout_ms > 0 &&
                 c->retry_initial_ms > 0 && c->retry_max_ms >= c->retry_initial_ms,
             "bounds");
  std::set<std::string> endpoints;
  for (const kvo::SourceConfig& s : c->sources) {
    FUZZ_CHECK(kvo::ValidateSource(s).ok(), "source '%s'", s.name.c_str());
    kvo::Result<std::vector<kvo::SourceStream>> streams = kvo::ExpandStreams(s);
    FUZZ_CHECK(streams.ok(), "%s", streams.status().ToString().c_str());
    FUZZ_CHECK(static_cast<int64_t>(streams->size()) == s.dp_ranks, "%zu streams for %lld ranks",
               streams->size(), static_cast<long long>(s.dp_ranks));
    for (const kvo::SourceStream& st : *streams) {
      FUZZ_CHECK(endpoints.insert(st.endpoint).second, "endpoint '%s' twice", st.endpoint.c_str());
    }
  }
  return 0;
}
