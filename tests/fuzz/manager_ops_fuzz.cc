// libFuzzer target: `kvo manager ops` scripts (kvo::RunOpsScriptLine, what the command runs for
// each line) against a real OffloadManager of 8 CPU blocks (lru or arc, chosen by the first byte),
// line by line (at most 64 lines). Never a crash, throw or manager CHECK; every answer is one line
// of JSON (an object); an error answer is a bounded message; a line reported bad answers an error.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "manager/offload_manager.h"
#include "manager/ops_script.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view script(reinterpret_cast<const char*>(data), size);
  const unsigned char mode = static_cast<unsigned char>(script[0]);
  script.remove_prefix(1);

  kvo::ManagerOptions options;
  options.num_blocks = 8;
  options.eviction_policy = (mode & 1) ? "arc" : "lru";
  options.store_threshold = (mode & 2) ? 2 : 0;
  options.max_tracker_size = 16;
  options.enable_events = true;
  auto manager = kvo::OffloadManager::Create(std::move(options));
  FUZZ_CHECK(manager.ok(), "%s", manager.status().ToString().c_str());

  size_t number = 0;
  size_t lines = 0;
  while (!script.empty() && lines < 64) {
    size_t end = script.find('\n');
    std::string_view text = script.substr(0, end);
    script.remove_prefix(end == std::string_view::npos ? script.size() : end + 1);
    ++number;
    bool bad = false;
    std::optional<std::string> answer = kvo::RunOpsScriptLine(**manager, text, number, &bad);
    if (!answer) continue;
    ++lines;
    FUZZ_CHECK(answer->find('\n') == std::string::npos, "a multi-line answer");
    nlohmann::json j = nlohmann::json::parse(*answer, nullptr, false);
    FUZZ_CHECK(!j.is_discarded() && j.is_object(), "answer is not a JSON object: %s",
               kvo_fuzz::Preview(*answer).c_str());
    if (j.contains("error")) {
      FUZZ_CHECK(j["error"].is_string(), "error is not a string");
      FUZZ_CHECK_MESSAGE(j["error"].get<std::string>());
    } else {
      FUZZ_CHECK(!bad, "a bad line without an error answer");
    }
  }
  return 0;
}
