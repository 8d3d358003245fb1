// Workload readers for the planner: Mooncake JSONL traces and kvo journals.
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "events/events.h"
#include "planner/planner.h"

namespace kvo {
namespace {

constexpr size_t kMaxReportedErrors = 10;

void Record(TraceReadReport* report, std::string error) {
  ++report->skipped;
  if (report->errors.size() < kMaxReportedErrors) report->errors.push_back(std::move(error));
}

Result<TraceRequest> ParseTraceLine(const std::string& line) {
  KVO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(line));
  if (!j.is_object()) return Status::InvalidArgument("expected a JSON object");
  TraceRequest r;
  auto int_field = [&](const char* key, int64_t* out, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end()) {
      return required ? Status::InvalidArgument(std::string("missing '") + key + "'")
                      : Status::Ok();
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Status::InvalidArgument(std::string("'") + key +
                                     "' must be a non-negative integer, got " + DescribeJson(*it));
    }
    *out = it->get<int64_t>();
    return Status::Ok();
  };
  KVO_RETURN_IF_ERROR(int_field("timestamp", &r.timestamp_ms, false));
  KVO_RETURN_IF_ERROR(int_field("input_length", &r.input_length, true));
  KVO_RETURN_IF_ERROR(int_field("output_length", &r.output_length, false));
  auto ids = j.find("hash_ids");
  if (ids == j.end() || !ids->is_array()) {
    return Status::InvalidArgument("'hash_ids' must be an array of non-negative integers");
  }
  r.hash_ids.reserve(ids->size());
  for (const auto& id : *ids) {
    if (!id.is_number_unsigned() && !(id.is_number_integer() && id.get<int64_t>() >= 0)) {
      return Status::InvalidArgument("'hash_ids' holds " + DescribeJson(id) +
                                     "; expected non-negative integers");
    }
    r.hash_ids.push_back(id.get<uint64_t>());
  }
  return r;
}

}  // namespace

Result<std::vector<TraceRequest>> ReadMooncakeTrace(const std::string& path, bool strict,
                                                    TraceReadReport* report) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open trace '" + path + "'");
  std::vector<TraceRequest> out;
  std::string line;
  while (std::getline(in, line)) {
    ++report->lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = ParseTraceLine(line);
    if (!r.ok()) {
      std::string msg =
          path + " line " + std::to_string(report->lines) + ": " + r.status().message();
      if (strict) return Status::InvalidArgument(msg);
      Record(report, std::move(msg));
      continue;
    }
    out.push_back(std::move(r).value());
  }
  return out;
}

Result<std::vector<TraceRequest>> ReadJournalWorkload(const std::string& dir,
                                                      TraceReadReport* report) {
  JournalOptions options;
  options.dir = dir;
  options.read_only = true;
  KVO_ASSIGN_OR_RETURN(auto journal, Journal::Open(options));
  std::vector<TraceRequest> out;
  if (journal->empty()) return out;
  KVO_ASSIGN_OR_RETURN(auto reader, journal->NewReader(0));
  JournalRecord record;
  while (true) {
    KVO_ASSIGN_OR_RETURN(bool more, reader->Next(&record));
    if (!more) break;
    ++report->lines;
    auto batch = DecodeBatch(record.payload);
    if (!batch.ok()) {
      Record(report, "seq " + std::to_string(record.seq) + ": " + batch.status().message());
      continue;
    }
    for (const KvEvent& e : batch->events) {
      const auto* stored = std::get_if<BlockStored>(&e);
      // The engine's own cache is the GPU medium, as the events mean it (events/event_fold.h:
      // an event without a medium is GPU).
      if (stored == nullptr || MediumOf(stored->medium) != kMediumGpu ||
          stored->block_hashes.empty()) {
        continue;
      }
      TraceRequest r;
      r.timestamp_ms = static_cast<int64_t>(batch->ts * 1000);
      for (const BlockHash& h : stored->block_hashes) r.hash_ids.push_back(h.Low64());
      r.input_length = static_cast<int64_t>(stored->token_ids.size());
      if (r.input_length == 0) {
        r.input_length = stored->block_size * static_cast<int64_t>(r.hash_ids.size());
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace kvo
