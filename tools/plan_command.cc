// kvo plan: the hit-rate curve of a workload against CPU-tier capacity and policy.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/planner.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

struct PlanArgs {
  std::string trace;
  std::string journal;
  uint64_t block_tokens = 512;
  std::string capacities = "1e6,3e6,1e7,3e7,1e8";
  std::string policies = "lru";
  bool json = false;
  bool strict = false;
  std::string svg;
};

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Result<std::vector<uint64_t>> ParseCapacities(const std::string& text) {
  std::vector<uint64_t> out;
  for (const std::string& item : SplitCommas(text)) {
    char* end = nullptr;
    double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !std::isfinite(v) || v < 0 || v > 1e18) {
      return Status::InvalidArgument("--capacity-tokens: '" + item +
                                     "' is not a token count (e.g. 1e6,3e6,1e7)");
    }
    out.push_back(static_cast<uint64_t>(std::llround(v)));
  }
  if (out.empty()) return Status::InvalidArgument("--capacity-tokens: no capacities given");
  return out;
}

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void Update(const std::string& label, size_t done, size_t total) {
    if (!enabled_ || total == 0) return;
    int width = 30, filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r%-22s [%s%s] %3zu%%", label.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done * 100 / total);
    std::fflush(stderr);
  }
  void Done() {
    if (enabled_) std::fprintf(stderr, "\r%70s\r", "");
  }

 private:
  bool enabled_;
};

nlohmann::json PointJson(const PlanPoint& p, uint64_t block_tokens) {
  return {{"policy", p.policy},
          {"capacity_tokens", p.capacity_tokens},
          {"capacity_blocks", p.capacity_blocks},
          {"effective_capacity_tokens", p.capacity_blocks * block_tokens},
          {"block_tokens", block_tokens},
          {"hit_rate", std::round(p.hit_rate() * 1e6) / 1e6},
          {"hit_tokens", p.hit_tokens},
          {"input_tokens", p.input_tokens},
          {"requests", p.requests},
          {"stores_rejected", p.stores_rejected},
          {"blocks_evicted", p.blocks_evicted}};
}

Status RunPlan(const PlanArgs& args) {
  if (args.trace.empty() == args.journal.empty()) {
    return Status::InvalidArgument("give exactly one workload: --trace FILE or --journal DIR");
  }
  if (args.block_tokens == 0) return Status::InvalidArgument("--block-tokens must be > 0");
  KVO_ASSIGN_OR_RETURN(std::vector<uint64_t> capacities, ParseCapacities(args.capacities));
  std::vector<std::string> policies = SplitCommas(args.policies);
  if (policies.empty()) return Status::InvalidArgument("--policy: no policy given");

  TraceReadReport report;
  Result<std::vector<TraceRequest>> trace =
      args.trace.empty() ? ReadJournalWorkload(args.journal, &report)
                         : ReadMooncakeTrace(args.trace, args.strict, &report);
  if (!trace.ok()) return trace.status();
  for (const std::string& e : report.errors)
    std::fprintf(stderr, "kvo plan: skipped %s\n", e.c_str());
  if (report.skipped > report.errors.size()) {
    std::fprintf(stderr, "kvo plan: ... %zu bad lines skipped in all\n", report.skipped);
  }

  ProgressBar bar(::isatty(STDERR_FILENO) != 0);
  std::vector<PlanPoint> points;
  for (const std::string& policy : policies) {
    for (uint64_t cap_tokens : capacities) {
      uint64_t blocks = cap_tokens / args.block_tokens;
      std::string label = policy + " " + std::to_string(cap_tokens);
      Result<PlanPoint> simulated =
          SimulateCapacity(*trace, policy, blocks, args.block_tokens,
                           [&](size_t d, size_t t) { bar.Update(label, d, t); });
      if (!simulated.ok()) {
        bar.Done();
        return simulated.status().WithContext("--capacity-tokens " + std::to_string(cap_tokens) +
                                              " with --block-tokens " +
                                              std::to_string(args.block_tokens));
      }
      PlanPoint p = *simulated;
      p.capacity_tokens = cap_tokens;  // as asked; the manager holds capacity_blocks whole blocks
      points.push_back(p);
    }
  }
  PlanPoint maximum = TheoreticalMaximum(*trace, args.block_tokens);
  // Cross-check: the real manager with room for every distinct block must reach the maximum.
  KVO_ASSIGN_OR_RETURN(
      PlanPoint roomy,
      SimulateCapacity(*trace, policies.front(), maximum.capacity_blocks, args.block_tokens,
                       [&](size_t d, size_t t) { bar.Update("unbounded check", d, t); }));
  bar.Done();
  if (roomy.hit_tokens != maximum.hit_tokens) {
    return Status::Internal("the manager with room for all " +
                            std::to_string(maximum.capacity_blocks) + " blocks hit " +
                            std::to_string(roomy.hit_tokens) + " tokens, the maximum is " +
                            std::to_string(maximum.hit_tokens));
  }

  if (args.json) {
    for (const PlanPoint& p : points)
      std::printf("%s\n", PointJson(p, args.block_tokens).dump().c_str());
    std::printf("%s\n", PointJson(maximum, args.block_tokens).dump().c_str());
  } else {
    std::printf("%zu requests, %llu input tokens, %llu distinct blocks of %llu tokens\n",
                maximum.requests, static_cast<unsigned long long>(maximum.input_tokens),
                static_cast<unsigned long long>(maximum.capacity_blocks),
                static_cast<unsigned long long>(args.block_tokens));
    std::printf("%-10s %16s %14s %9s %16s\n", "policy", "capacity_tokens", "blocks", "hit_rate",
                "stores_rejected");
    for (const PlanPoint& p : points) {
      std::printf("%-10s %16llu %14llu %8.2f%% %16llu\n", p.policy.c_str(),
                  static_cast<unsigned long long>(p.capacity_tokens),
                  static_cast<unsigned long long>(p.capacity_blocks), p.hit_rate() * 100,
                  static_cast<unsigned long long>(p.stores_rejected));
    }
    std::printf(
        "%-10s %16llu %14llu %8.2f%%   (theoretical maximum; the manager at this size "
        "reproduces it)\n",
        "unbounded", static_cast<unsigned long long>(maximum.capacity_tokens),
        static_cast<unsigned long long>(maximum.capacity_blocks), maximum.hit_rate() * 100);
  }
  if (!args.svg.empty()) {
    std::ofstream out(args.svg);
    out << RenderPlanSvg(points, maximum,
                         "Prefix hit rate vs CPU tier capacity: " +
                             (args.trace.empty() ? args.journal : args.trace));
    if (!out) return Status::IOError("cannot write --svg '" + args.svg + "'");
  }
  return Status::Ok();
}

}  // namespace

void AddPlanCommand(CLI::App& app, CommandTable& commands) {
  auto* cmd = app.add_subcommand(
      "plan", "Hit rate of a workload (Mooncake trace or kvo journal) against tier capacity");
  auto args = std::make_shared<PlanArgs>();
  cmd->add_option("--trace", args->trace, "Mooncake-format JSONL trace");
  cmd->add_option("--journal", args->journal, "a kvo journal directory as the workload");
  cmd->add_option("--block-tokens", args->block_tokens, "tokens per hash id")
      ->capture_default_str();
  cmd->add_option("--capacity-tokens", args->capacities, "comma-separated capacities in tokens")
      ->capture_default_str();
  cmd->add_option("--policy", args->policies, "comma-separated policies (lru,arc)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "one JSON object per (policy, capacity), then the maximum");
  cmd->add_flag("--strict", args->strict, "a bad trace line is fatal instead of skipped");
  cmd->add_option("--svg", args->svg, "write a plot of hit rate against capacity");
  commands.AddStatus(cmd, [args] { return RunPlan(*args); });
}

}  // namespace kvo::cli
