// libFuzzer target: kvo::ParseSourceFlag (`--source NAME=ENDPOINT[,key=value...]`) and
// ParseHttpAddress (`--http HOST:PORT`) on arbitrary text. Never a crash; an error is
// InvalidArgument with a bounded message. An accepted source validates, expands into dp_ranks
// streams, and a hash_*/block_size key enables its parity doctor with a sane config; an accepted
// address has a port in [0, 65535].
#include <cstdint>
#include <string>
#include <string_view>

#include "indexer/service/sources_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kvo::Result<kvo::HttpAddress> address = kvo::ParseHttpAddress(input);
  if (address.ok()) {
    FUZZ_CHECK(address->port >= 0 && address->port <= 65535, "port %d", address->port);
    (void)kvo::IsLoopbackHost(address->host);
  } else {
    FUZZ_CHECK_MESSAGE(address.status().message());
  }

  kvo::Result<kvo::SourceConfig> s = kvo::ParseSourceFlag(input);
  if (!s.ok()) {
    FUZZ_CHECK(s.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               s.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(s.status().message());
    return 0;
  }
  kvo::Status valid = kvo::ValidateSource(*s);
  FUZZ_CHECK(valid.ok(), "an accepted flag does not validate: %s", valid.ToString().c_str());
  FUZZ_CHECK(input.starts_with(s->name + "="), "name '%s'", s->name.c_str());
  kvo::Result<std::vector<kvo::SourceStream>> streams = kvo::ExpandStreams(*s);
  FUZZ_CHECK(streams.ok(), "%s", streams.status().ToString().c_str());
  FUZZ_CHECK(static_cast<int64_t>(streams->size()) == s->dp_ranks, "streams");
  if (s->hash)
    FUZZ_CHECK(s->hash->block_size > 0, "block_size %lld",
               static_cast<long long>(s->hash->block_size));
  return 0;
}
