// libFuzzer target: kvo::ParseKvEventsConfig (`--kv-events-config`) on arbitrary text must never
// crash or throw; an error is InvalidArgument with a bounded message. An accepted config is valid
// (publisher, encoding, fsync policy) and round-trips: written back as JSON with every key, it
// parses to the same config. The endpoint helpers (OffsetEndpointPort, ShouldBind,
// BindsBeyondLoopback) run on the accepted endpoints with a rank taken from the input.
#include <cstdint>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "events/journal.h"
#include "events/kv_events_config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool Same(const kvo::KvEventsConfig& a, const kvo::KvEventsConfig& b) {
  return a.enable_kv_cache_events == b.enable_kv_cache_events && a.publisher == b.publisher &&
         a.endpoint == b.endpoint && a.replay_endpoint == b.replay_endpoint &&
         a.buffer_steps == b.buffer_steps && a.hwm == b.hwm &&
         a.max_queue_size == b.max_queue_size && a.topic == b.topic &&
         a.journal_dir == b.journal_dir && a.journal_fsync == b.journal_fsync &&
         a.encoding == b.encoding;
}

std::string ToJson(const kvo::KvEventsConfig& c) {
  nlohmann::json j;
  j["enable_kv_cache_events"] = c.enable_kv_cache_events;
  j["publisher"] = c.publisher;
  j["endpoint"] = c.endpoint;
  j["replay_endpoint"] = c.replay_endpoint ? nlohmann::json(*c.replay_endpoint) : nullptr;
  j["buffer_steps"] = c.buffer_steps;
  j["hwm"] = c.hwm;
  j["max_queue_size"] = c.max_queue_size;
  j["topic"] = c.topic;
  j["journal_dir"] = c.journal_dir ? nlohmann::json(*c.journal_dir) : nullptr;
  j["journal_fsync"] = c.journal_fsync;
  j["encoding"] = c.encoding;
  return j.dump();
}

void CheckEndpoint(std::string_view endpoint, int64_t rank) {
  (void)kvo::ShouldBind(endpoint);
  (void)kvo::BindsBeyondLoopback(endpoint);
  kvo::Result<std::string> offset = kvo::OffsetEndpointPort(endpoint, rank);
  if (!offset.ok()) {
    FUZZ_CHECK(offset.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               offset.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(offset.status().message());
  } else if (rank == 0) {
    FUZZ_CHECK(*offset == endpoint, "rank 0 changed the endpoint");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kvo::Result<kvo::KvEventsConfig> c = kvo::ParseKvEventsConfig(input);
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               c.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(c.status().message());
    return 0;
  }
  FUZZ_CHECK(c->publisher == "null" || c->publisher == "zmq", "publisher %s", c->publisher.c_str());
  FUZZ_CHECK(c->encoding == "map" || c->encoding == "array", "encoding %s", c->encoding.c_str());
  FUZZ_CHECK(kvo::ParseFsyncPolicy(c->journal_fsync).ok(), "journal_fsync %s",
             c->journal_fsync.c_str());
  FUZZ_CHECK(!c->journal_dir || !c->journal_dir->empty(), "an empty journal_dir accepted");

  const std::string again_text = ToJson(*c);
  kvo::Result<kvo::KvEventsConfig> again = kvo::ParseKvEventsConfig(again_text);
  FUZZ_CHECK(again.ok(), "the config written back does not parse: %s\n%s",
             again.status().ToString().c_str(), kvo_fuzz::Preview(again_text, 2000).c_str());
  FUZZ_CHECK(Same(*c, *again), "round trip changed the config\n%s",
             kvo_fuzz::Preview(again_text, 2000).c_str());

  // A rank from the input's last bytes, small or huge.
  int64_t rank = 0;
  for (size_t i = size > 8 ? size - 8 : 0; i < size; ++i) rank = (rank << 8) | data[i];
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{7}, rank}) {
    CheckEndpoint(c->endpoint, r);
    if (c->replay_endpoint) CheckEndpoint(*c->replay_endpoint, r);
  }
  return 0;
}
