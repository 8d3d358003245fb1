// `kvo demo` as processes (CI's shortened demo, label `demo`): the real binary runs the indexer,
// two `kvo sim`s, `kvo route` and `kvo load` for both policies; its JSON must show 0 mismatches,
// a consistent index and kv routing ahead of round-robin in hit rate, within 60 s. And the bad
// paths: a child that cannot start is named with its log, and SIGTERM during the load stops every
// child (none left running). Synchronisation is on what the demo prints; deadlines only turn a
// hang into a failure.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

// The shortened workload CI runs (the README's default is larger).
// 6 conversations of 3 turns, 128 GPU blocks per engine: a turn's prompt needs up to 114 blocks,
// so every engine evicts and its later turns load from the offload tiers under every policy
// (with the demo's 192 a round-robin run could end without one offload hit: CI saw 0 verified).
const std::vector<std::string> kShort = {"--conversations", "6",  "--turns", "3",
                                         "--gpu-blocks",    "128"};

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// "(pid N)" of every child the demo announced.
std::vector<pid_t> AnnouncedPids(const std::string& text) {
  std::vector<pid_t> pids;
  static const std::regex re(R"(\(pid (\d+)\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1].str())));
  }
  return pids;
}

// A live (not zombie) process with this pid?
bool Alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

TEST(DemoTest, ShortDemoJsonVerdict) {
  testing::TempDir dir;
  // No --workdir: the demo's own temp dir (tmpfs when present), removed after a good run.
  std::vector<std::string> argv = {
      KVO_BINARY, "demo", "--json", "--instances", "2", "--svg", dir.path() + "/demo.svg"};
  argv.insert(argv.end(), kShort.begin(), kShort.end());
  const auto t0 = SteadyClock::now();
  const testing::CommandResult r = testing::RunCommand(argv, seconds(180));
  const double wall = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto j = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  std::printf("demo wall %.1f s; ratio %s\n", wall, j.value("ratio", Json()).dump().c_str());
  EXPECT_EQ(j["mismatches"], 0) << r.out;
  EXPECT_EQ(j["consistent"], true) << r.out << r.err;
  const Json& kv = j["policies"]["kv"];
  const Json& rr = j["policies"]["round-robin"];
  ASSERT_TRUE(kv.is_object() && rr.is_object()) << r.out;
  for (const Json* p : {&kv, &rr}) {
    EXPECT_GT((*p)["requests"].get<int64_t>(), 0);
    EXPECT_EQ((*p)["errors"], 0);
    EXPECT_GT((*p)["blocks_verified"].get<int64_t>(), 0) << "hits were verified byte for byte";
    EXPECT_GT((*p)["events_indexed"].get<int64_t>(), 0);
    // Every block event the engines published reached the index (same unit on both sides).
    EXPECT_EQ((*p)["events_indexed"], (*p)["events_published"]) << r.out;
    EXPECT_EQ((*p)["checks"].size(), 2u * 3u) << "2 instances x GPU, CPU, DISK";
  }
  EXPECT_GT(kv["hit_rate"].get<double>(), rr["hit_rate"].get<double>()) << r.out;
  EXPECT_LT(wall, 60.0) << "the shortened demo must fit CI's budget";
  std::ifstream svg(dir.path() + "/demo.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(Has(text, "<svg") && Has(text, "</svg>")) << text.substr(0, 200);
}

TEST(DemoTest, AChildThatCannotStartIsNamedAndNothingIsLeft) {
  testing::TempDir dir;
  const testing::CommandResult r = testing::RunCommand(
      {KVO_BINARY, "demo", "--workdir", dir.path() + "/run", "--sim-arg=--no-such-flag"},
      seconds(120));
  EXPECT_NE(r.code, 0);
  // Both sims get the bad flag; whichever the supervisor sees die first is named (before it
  // listened, or while the supervisor waited for the other one).
  EXPECT_TRUE(Has(r.err, "sim-0") || Has(r.err, "sim-1")) << r.err;
  EXPECT_TRUE(Has(r.err, "exited before listening") || Has(r.err, "exited unexpectedly")) << r.err;
  EXPECT_TRUE(Has(r.err, "no-such-flag")) << "the child's own log lines: " << r.err;
  for (pid_t pid : AnnouncedPids(r.err)) EXPECT_FALSE(Alive(pid)) << pid << " left running";
}

TEST(DemoTest, SigtermDuringTheLoadStopsEveryChild) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // orphans would come here, not to init
  testing::TempDir dir;
  // stderr into stdout (the progress lines), the shell replaced by kvo (exec): its pid is kvo's.
  std::string cmd = std::string("exec ") + KVO_BINARY + " demo --workdir " + dir.path() +
                    "/run --conversations 40 --turns 8 2>&1";
  testing::ChildProcess demo({"/bin/sh", "-c", cmd});
  std::vector<pid_t> pids;
  std::vector<int> pidfds;
  std::string seen;
  const auto deadline = SteadyClock::now() + seconds(120);
  bool load_running = false;
  while (auto line = demo.ReadStdoutLine(deadline)) {
    seen += *line + "\n";
    for (pid_t p : AnnouncedPids(*line)) {
      pids.push_back(p);
      pidfds.push_back(static_cast<int>(::syscall(SYS_pidfd_open, p, 0)));
    }
    if (Has(*line, "load (pid")) {
      load_running = true;
      break;
    }
  }
  ASSERT_TRUE(load_running) << seen;
  ASSERT_EQ(pids.size(), 5u) << "indexer, 2 sims, router, load: " << seen;
  demo.Signal(SIGTERM);
  const int code = demo.Wait(SteadyClock::now() + seconds(60));
  EXPECT_EQ(code, 128 + SIGTERM) << seen << demo.out();
  EXPECT_TRUE(Has(demo.out(), "interrupted by SIGTERM")) << demo.out();
  for (size_t i = 0; i < pids.size(); ++i) {
    ASSERT_GE(pidfds[i], 0) << pids[i];
    pollfd p{pidfds[i], POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 1000), 1) << "pid " << pids[i] << " still running after the demo";
    ::close(pidfds[i]);
    ::waitpid(pids[i], nullptr, WNOHANG);
    EXPECT_FALSE(Alive(pids[i])) << pids[i];
  }
}

}  // namespace
}  // namespace kvo
