// Capacity planning: replay a request trace (Mooncake format, or a kvo journal) through the real
// OffloadManager at several CPU-tier sizes and policies, and report the prefix hit rate — the
// question every user of `cpu_bytes_to_use` asks. No data moves; only the manager's bookkeeping
// runs. Public header of kvo_planner. Functions are thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

namespace kvo {

// One request: its prompt as prefix-block ids (Mooncake: one id per 512 tokens, last partial).
struct TraceRequest {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;  // tokens
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

struct TraceReadReport {
  size_t lines = 0;
  size_t skipped = 0;               // bad lines skipped (non-strict)
  std::vector<std::string> errors;  // the first few, "line 12: ..."
};

// Reads a Mooncake-format JSONL trace. A corrupt or truncated line is reported with its line number
// and skipped; with `strict` it is an error.
Result<std::vector<TraceRequest>> ReadMooncakeTrace(const std::string& path, bool strict,
                                                    TraceReadReport* report);

// Turns a kvo journal into a workload: every GPU BlockStored event is one request whose blocks are
// the event's block hashes (its tokens: block_size per hash).
Result<std::vector<TraceRequest>> ReadJournalWorkload(const std::string& dir,
                                                      TraceReadReport* report);

struct PlanPoint {
  std::string policy;  // "lru", "arc", or "unbounded"
  uint64_t capacity_tokens = 0;
  uint64_t capacity_blocks = 0;
  uint64_t input_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t requests = 0;
  uint64_t stores_rejected = 0;  // prepare_store answered "cannot store"
  uint64_t blocks_evicted = 0;
  double hit_rate() const {
    return input_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / double(input_tokens);
  }
};

// Called with (requests done, total) now and then.
using ProgressFn = std::function<void(size_t, size_t)>;

// The largest CPU tier the manager holds (its policy tables index nodes with 28 bits; ARC keeps
// up to twice its capacity in nodes).
inline constexpr uint64_t kMaxPlanCapacityBlocks = ((uint64_t{1} << 28) - 1) / 2 - 16;

// Replays `trace` through an OffloadManager with `capacity_blocks` CPU slots and `policy`. For
// each request in order: it hits its longest run of leading hash ids present (hit tokens =
// min(hits * block_tokens, input_length)); then every one of its hash ids is offered for storing.
// A capacity above the trace's distinct blocks is simulated with room for exactly those (the
// answers are the same: nothing is ever evicted). InvalidArgument when even that exceeds
// kMaxPlanCapacityBlocks.
Result<PlanPoint> SimulateCapacity(const std::vector<TraceRequest>& trace,
                                   const std::string& policy, uint64_t capacity_blocks,
                                   uint64_t block_tokens, const ProgressFn& progress = nullptr);

// The hit rate of an unbounded cache replaying the trace in order (the theoretical maximum),
// computed directly with a set, independently of the manager.
PlanPoint TheoreticalMaximum(const std::vector<TraceRequest>& trace, uint64_t block_tokens);

// An SVG line plot of hit rate against capacity (log scale), one line per policy, with the
// theoretical maximum as a dashed line.
std::string RenderPlanSvg(const std::vector<PlanPoint>& points, const PlanPoint& maximum,
                          const std::string& title);

}  // namespace kvo
