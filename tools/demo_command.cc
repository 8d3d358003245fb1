// kvo demo: the deployment as processes (demo/demo.h) — indexer, N engines, router, load — once
// per routing policy with fresh state, then the report and the consistency verdict.
// kvo demo --tour: the earlier one-process tour of the event bus and pipeline (demo_tour.cc).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "demo/demo.h"
#include "supervisor/supervisor.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

struct DemoArgs {
  bool tour = false;
  int batches = 12;
  bool json = false;
  std::string svg;
  std::string workdir;
  bool keep = false;
  demo::DemoOptions options;
  std::vector<std::string> policies;
};

Result<std::string> SelfPath() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return Status::IOError("cannot read /proc/self/exe (the kvo binary's path)");
  return std::string(buf, static_cast<size_t>(n));
}

// The run's directory: --workdir (created; must hold no earlier run) or a new temp dir.
Result<std::string> MakeWorkdir(const std::string& wanted) {
  std::error_code ec;
  if (!wanted.empty()) {
    std::filesystem::create_directories(wanted, ec);
    if (ec) return Status::InvalidArgument("--workdir " + wanted + ": " + ec.message());
    if (!std::filesystem::is_empty(wanted, ec)) {
      return Status::InvalidArgument("--workdir " + wanted +
                                     " is not empty: every run starts from fresh state; choose "
                                     "a new or empty directory");
    }
    return std::filesystem::absolute(wanted).string();
  }
  // $TMPDIR when set; else /dev/shm when usable (tmpfs: the engines' file tiers write and delete
  // thousands of block files, and on this machine's disk (online discard) deleting them took
  // 25-45 s at times); else /tmp.
  const char* env = std::getenv("TMPDIR");
  std::string base = env != nullptr && *env != '\0' ? env : "";
  if (base.empty()) {
    base = std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK | X_OK) == 0
               ? "/dev/shm"
               : "/tmp";
  }
  std::string tmpl = base + "/kvo-demo-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Status::IOError("cannot create a temp dir " + tmpl + ": " + std::strerror(errno));
  }
  return tmpl;
}

ExitCode RunProcessDemo(DemoArgs& a) {
  KVO_RETURN_IF_ERROR(Supervisor::InstallSignalHandlers());
  KVO_ASSIGN_OR_RETURN(std::string self, SelfPath());
  auto dir = MakeWorkdir(a.workdir);
  if (!dir.ok()) {
    ReportError(dir.status());
    return 2;  // the working directory is the user's to fix
  }
  a.options.kvo_binary = self;
  a.options.workdir = *dir;
  if (!a.policies.empty()) a.options.policies = a.policies;
  a.options.progress = stderr;
  std::fprintf(stderr, "kvo demo: working files and logs under %s\n", dir->c_str());
  auto report = demo::RunDemo(a.options);
  if (!report.ok()) {
    std::fprintf(stderr, "kvo demo: %s\nkvo demo: logs kept in %s\n",
                 report.status().ToString().c_str(), dir->c_str());
    const int sig = Supervisor::TerminationSignal();
    return sig != 0 ? 128 + sig : 1;
  }
  if (a.json) {
    std::printf("%s\n", demo::RenderJson(*report)
                            .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                            .c_str());
  } else {
    std::printf("%s", demo::RenderText(*report).c_str());
  }
  std::fflush(stdout);
  if (!a.svg.empty()) {
    std::ofstream f(a.svg, std::ios::trunc);
    f << demo::RenderSvg(*report);
    if (!f.good()) {
      return Status::IOError("--svg " + a.svg + ": cannot write");
    }
    std::fprintf(stderr, "kvo demo: wrote %s\n", a.svg.c_str());
  }
  const bool good = report->mismatches() == 0 && report->consistent();
  if (good && !a.keep && a.workdir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
  } else {
    std::fprintf(stderr, "kvo demo: files kept in %s\n", dir->c_str());
  }
  return good ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App& app, CommandTable& commands) {
  auto* cmd = app.add_subcommand(
      "demo",
      "Run the deployment as processes: kvo index serve, N x kvo sim, kvo route, then kvo load "
      "once per routing policy (kv, then round-robin, fresh state each); print the report and "
      "the consistency verdict (--tour: the earlier one-process tour)");
  auto a = std::make_shared<DemoArgs>();
  cmd->add_flag("--tour", a->tour,
                "the one-process tour instead: event bus (replay, journal), then the pipeline");
  cmd->add_option("--batches", a->batches, "--tour: how many batches to publish")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000000));
  cmd->add_flag("--json", a->json,
                "print the report as one JSON object (with --tour: batches as JSON)");
  cmd->add_option("--instances", a->options.instances, "engines (kvo sim processes)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--workdir", a->workdir,
                  "working files and logs here (new or empty; default: a temp dir, removed after "
                  "a good run)");
  cmd->add_flag("--keep", a->keep, "keep the temp dir after a good run");
  cmd->add_option("--svg", a->svg, "also draw TTFT distributions and hit rate per tier to FILE");
  cmd->add_option("--trace", a->options.trace,
                  "replay this Mooncake JSONL trace instead of the synthetic workload")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-requests", a->options.max_requests, "stop the workload after N requests")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--speedup", a->options.speedup, "replay the trace's arrival times X faster")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--conversations", a->options.conversations, "synthetic workload: conversations")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--turns", a->options.turns, "synthetic workload: turns per conversation")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--seed", a->options.seed, "workload and engine seed")->capture_default_str();
  cmd->add_option(
         "--gpu-blocks", a->options.gpu_blocks,
         "each engine's GPU prefix cache, in blocks (kvo sim --gpu-blocks; 0: its default)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--cpu-blocks", a->options.cpu_blocks,
                  "each engine's CPU tier, in blocks (kvo sim --cpu-blocks; 0: its default)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--load-penalty", a->options.load_penalty,
                  "kvo route --load-penalty: blocks of prefix one request in flight costs "
                  "(negative: the router's default)")
      ->capture_default_str();
  cmd->add_option("--policy", a->policies,
                  "routing policies to run, in order (repeatable; default kv, round-robin)")
      ->check(CLI::IsMember({"kv", "round-robin", "random", "least-loaded"}));
  cmd->add_option("--sim-arg", a->options.sim_args,
                  "extra argument for every kvo sim (repeatable), e.g. --sim-arg=--gpu-blocks=64");
  cmd->add_option("--route-arg", a->options.route_args, "extra argument for kvo route");
  cmd->add_option("--load-arg", a->options.load_args, "extra argument for kvo load");
  commands.Add(cmd, [a]() -> ExitCode {
    if (a->tour) {
      KVO_RETURN_IF_ERROR(RunTour(a->batches, a->json));
      return 0;
    }
    return RunProcessDemo(*a);
  });
}

}  // namespace kvo::cli
