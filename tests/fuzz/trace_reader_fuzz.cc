// libFuzzer target: Mooncake trace files (kvo::ReadMooncakeTrace, `kvo plan --trace`): the input
// is the file. Never a crash or throw. Non-strict reading always succeeds, counts every line, and
// keeps each non-blank line either as a request or as a skipped line (at most 10 errors kept,
// each a bounded message); strict reading succeeds exactly when nothing was skipped, with the same
// requests, and otherwise names the first bad line in a bounded message. Requests hold
// non-negative lengths.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "planner/planner.h"
#include "tests/fuzz/fuzz_check.h"

namespace {
std::string g_root;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_root = kvo_fuzz::MakeScratchRoot("trace");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string path = g_root + "/trace.jsonl";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(input.data(), static_cast<std::streamsize>(input.size()));
  }
  size_t lines = 0;
  size_t blank = 0;
  for (size_t pos = 0; pos < input.size();) {
    size_t end = input.find('\n', pos);
    if (end == std::string_view::npos) end = input.size();
    ++lines;
    if (input.substr(pos, end - pos).find_first_not_of(" \t\r") == std::string_view::npos) ++blank;
    pos = end + 1;
  }

  kvo::TraceReadReport report;
  auto loose = kvo::ReadMooncakeTrace(path, false, &report);
  FUZZ_CHECK(loose.ok(), "%s", loose.status().ToString().c_str());
  FUZZ_CHECK(report.lines == lines, "%zu lines counted, file has %zu", report.lines, lines);
  FUZZ_CHECK(loose->size() + report.skipped + blank == lines, "%zu kept + %zu skipped + %zu blank",
             loose->size(), report.skipped, blank);
  FUZZ_CHECK(report.errors.size() <= 10 && report.errors.size() <= report.skipped, "errors kept");
  for (const std::string& e : report.errors) FUZZ_CHECK_MESSAGE(e);
  for (const kvo::TraceRequest& r : *loose) {
    FUZZ_CHECK(r.timestamp_ms >= 0 && r.input_length >= 0 && r.output_length >= 0, "negative");
  }

  kvo::TraceReadReport strict_report;
  auto strict = kvo::ReadMooncakeTrace(path, true, &strict_report);
  if (report.skipped == 0) {
    FUZZ_CHECK(strict.ok(), "%s", strict.status().ToString().c_str());
    FUZZ_CHECK(strict->size() == loose->size(), "strict read other requests");
    for (size_t i = 0; i < strict->size(); ++i) {
      FUZZ_CHECK((*strict)[i].hash_ids == (*loose)[i].hash_ids, "request %zu differs", i);
    }
  } else {
    FUZZ_CHECK(!strict.ok(), "strict accepted a file with %zu bad lines", report.skipped);
    FUZZ_CHECK(strict.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               strict.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(strict.status().message());
  }
  return 0;
}
