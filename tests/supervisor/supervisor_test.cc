// The process supervisor against real processes: /bin/sh children that print a listening line,
// die by kill -9, ignore SIGTERM or leave grandchildren behind; and the supervisor itself as a
// process (this test binary re-executed) stopped by SIGTERM or killed by SIGKILL, after which no
// child may be left running. Synchronisation is on what the processes print and on pidfds;
// deadlines only turn a hang into a failure.
#include "supervisor/supervisor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/json.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kListen =
    R"(echo '{"event":"listening","http":"http://127.0.0.1:1","port":1}')";

ChildSpec Sh(std::string name, std::string script, ChildRole role = ChildRole::kServer) {
  return ChildSpec{std::move(name), {"/bin/sh", "-c", std::move(script)}, {}, role};
}

std::unique_ptr<Supervisor> MakeSupervisor(const std::string& dir,
                                           milliseconds grace = seconds(3)) {
  SupervisorOptions o;
  o.log_dir = dir;
  o.stop_grace = grace;
  auto s = Supervisor::Create(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Waits (bounded) until the process behind `pidfd` has exited. True when it did.
bool Exited(int pidfd, milliseconds timeout) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

// A live (not zombie) process with this pid?
bool Alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(SupervisorTest, ServerListeningLineCapturedLogsAndStop) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(
      sup->Start(
             Sh("srv", std::string("echo starting >&2; echo hello; echo '{\"event\":\"other\"}'; "
                                   "echo '{not json'; ") +
                           kListen + "; exec sleep 600"))
          .ok());
  auto line = sup->WaitListening("srv", seconds(20));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto j = ParseJson(*line);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["port"], 1);
  const pid_t pid = sup->Pid("srv");
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(Alive(pid));
  EXPECT_TRUE(sup->Check().ok());
  sup->StopAll();
  EXPECT_FALSE(Alive(pid));
  EXPECT_TRUE(sup->Check().ok()) << "a stopped server is not a failure";
  EXPECT_EQ(ReadFile(sup->LogPath("srv")), "starting\n");
  EXPECT_NE(ReadFile(sup->StdoutPath("srv")).find("hello\n"), std::string::npos);
  auto out = sup->Stdout("srv");
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->find("listening"), std::string::npos);
}

TEST(SupervisorTest, ExitBeforeListeningNamesChildCodeAndLog) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->Start(Sh("indexer", "echo 'port 8080 in use' >&2; exit 3")).ok());
  auto line = sup->WaitListening("indexer", seconds(20));
  ASSERT_FALSE(line.ok());
  const std::string m = line.status().message();
  EXPECT_NE(m.find("indexer"), std::string::npos) << m;
  EXPECT_NE(m.find("exit code 3"), std::string::npos) << m;
  EXPECT_NE(m.find("port 8080 in use"), std::string::npos) << m;
  EXPECT_FALSE(sup->Check().ok());
}

TEST(SupervisorTest, ListeningTimeoutIsBoundedAndNamed) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->Start(Sh("mute", "echo 'still loading' >&2; exec sleep 600")).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto line = sup->WaitListening("mute", milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(line.ok());
  EXPECT_NE(line.status().message().find("not listening within 300 ms"), std::string::npos)
      << line.status().message();
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, seconds(10));
  const pid_t pid = sup->Pid("mute");
  sup->StopAll();
  EXPECT_FALSE(Alive(pid));
}

TEST(SupervisorTest, KillMinus9OfAServerEndsAWaitNamingIt) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->Start(Sh("sim-0", std::string("echo 'sim-0 serving' >&2; ") + kListen +
                                         "; exec sleep 600"))
                  .ok());
  ASSERT_TRUE(sup->Start(Sh("sim-1", std::string(kListen) + "; exec sleep 600")).ok());
  ASSERT_TRUE(sup->WaitListening("sim-0", seconds(20)).ok());
  ASSERT_TRUE(sup->WaitListening("sim-1", seconds(20)).ok());
  ASSERT_TRUE(sup->Start(Sh("load", "exec sleep 600", ChildRole::kTask)).ok());
  const pid_t victim = sup->Pid("sim-0"), other = sup->Pid("sim-1"), load = sup->Pid("load");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  auto r = sup->WaitExit("load", seconds(30));
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("sim-0"), std::string::npos) << m;
  EXPECT_NE(m.find("exited unexpectedly"), std::string::npos) << m;
  EXPECT_NE(m.find("killed by signal 9 (SIGKILL)"), std::string::npos) << m;
  EXPECT_NE(m.find("sim-0 serving"), std::string::npos) << m;
  const auto t0 = std::chrono::steady_clock::now();
  sup->StopAll();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(3)) << "sleep obeys SIGTERM";
  EXPECT_FALSE(Alive(other));
  EXPECT_FALSE(Alive(load));
}

TEST(SupervisorTest, TaskExitCodesAndFailures) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->Start(Sh("ok", "echo '{\"requests\":3}'", ChildRole::kTask)).ok());
  auto e = sup->WaitExit("ok", seconds(20));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->exit_code, 0);
  EXPECT_TRUE(sup->Check().ok());
  auto out = sup->Stdout("ok");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "{\"requests\":3}\n");

  ASSERT_TRUE(
      sup->Start(Sh("bad", "echo 'trace: line 7: not JSON' >&2; exit 4", ChildRole::kTask)).ok());
  auto b = sup->WaitExit("bad", seconds(20));
  ASSERT_TRUE(b.ok()) << "the awaited task's own code is an answer";
  EXPECT_EQ(b->exit_code, 4);
  EXPECT_EQ(b->Describe(), "exit code 4");

  // A task that fails while something else is awaited is a failure of that wait.
  ASSERT_TRUE(sup->Start(Sh("srv", std::string(kListen) + "; exec sleep 600")).ok());
  ASSERT_TRUE(sup->Start(Sh("bad2", "echo 'bad2 broke' >&2; exit 5", ChildRole::kTask)).ok());
  auto w = sup->WaitExit("srv", seconds(20));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("bad2"), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find("exit code 5"), std::string::npos);
  EXPECT_NE(w.status().message().find("bad2 broke"), std::string::npos);
}

TEST(SupervisorTest, StopEscalatesToSigkillForAChildIgnoringSigterm) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path(), milliseconds(300));
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(
      sup->Start(Sh("stubborn", std::string("trap '' TERM; ") + kListen + "; exec sleep 600"))
          .ok());
  ASSERT_TRUE(sup->WaitListening("stubborn", seconds(20)).ok());
  const pid_t pid = sup->Pid("stubborn");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(sup->Stop("stubborn").ok());
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, seconds(10));
  EXPECT_FALSE(Alive(pid));
  auto e = sup->WaitExit("stubborn", seconds(1));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGKILL);
}

TEST(SupervisorTest, GrandchildrenInTheGroupAreStoppedToo) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // orphans come to this test, not init
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(
      sup->Start(Sh("parent", std::string("sleep 600 & echo \"{\\\"event\\\":\\\"listening\\\","
                                          "\\\"grandchild\\\":$!}\"; wait")))
          .ok());
  auto line = sup->WaitListening("parent", seconds(20));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto j = ParseJson(*line);
  ASSERT_TRUE(j.ok()) << *line;
  const pid_t grandchild = (*j)["grandchild"].get<pid_t>();
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, grandchild, 0));
  ASSERT_GE(pidfd, 0);
  sup->StopAll();
  EXPECT_TRUE(Exited(pidfd, seconds(10))) << "grandchild " << grandchild << " outlived the stop";
  ::close(pidfd);
  ::waitpid(grandchild, nullptr, WNOHANG);  // ours if it was orphaned before it died
  EXPECT_FALSE(Alive(grandchild));
}

// The leader dies on its own (kill -9): what it left in its group is killed when it is reaped.
TEST(SupervisorTest, GrandchildrenOfADeadLeaderAreKilled) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(
      sup->Start(Sh("parent", std::string("sleep 600 & echo \"{\\\"event\\\":\\\"listening\\\","
                                          "\\\"grandchild\\\":$!}\"; wait")))
          .ok());
  auto line = sup->WaitListening("parent", seconds(20));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto j = ParseJson(*line);
  ASSERT_TRUE(j.ok()) << *line;
  const pid_t grandchild = (*j)["grandchild"].get<pid_t>();
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, grandchild, 0));
  ASSERT_GE(pidfd, 0);
  ASSERT_EQ(::kill(sup->Pid("parent"), SIGKILL), 0);
  auto e = sup->WaitExit("parent", seconds(20));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGKILL);
  EXPECT_TRUE(Exited(pidfd, seconds(10))) << "grandchild " << grandchild << " outlived its leader";
  ::close(pidfd);
  ::waitpid(grandchild, nullptr, WNOHANG);
  EXPECT_FALSE(Alive(grandchild));
}

TEST(SupervisorTest, BadSpecsAreRefusedClearly) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  Status s = sup->Start(ChildSpec{"x", {"/nonexistent/kvo"}, {}, ChildRole::kServer});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/nonexistent/kvo"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No such file"), std::string::npos) << s.message();
  EXPECT_EQ(sup->Start(ChildSpec{"a b", {"/bin/true"}, {}, ChildRole::kTask}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sup->Start(ChildSpec{"rel", {"true"}, {}, ChildRole::kTask}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(sup->Start(ChildSpec{"t", {"/bin/true"}, {}, ChildRole::kTask}).ok());
  EXPECT_EQ(sup->Start(ChildSpec{"t", {"/bin/true"}, {}, ChildRole::kTask}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sup->WaitListening("nobody", seconds(1)).status().code(), StatusCode::kNotFound);
  SupervisorOptions o;
  o.log_dir = dir.path() + "/missing";
  EXPECT_EQ(Supervisor::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(SupervisorTest, EnvironmentOverrides) {
  testing::TempDir dir;
  auto sup = MakeSupervisor(dir.path());
  ASSERT_NE(sup, nullptr);
  ChildSpec spec = Sh("env", "echo \"$KVO_SUP_TEST_VAR\"", ChildRole::kTask);
  spec.env = {"KVO_SUP_TEST_VAR=forty-two"};
  ASSERT_TRUE(sup->Start(spec).ok());
  ASSERT_TRUE(sup->WaitExit("env", seconds(20)).ok());
  EXPECT_EQ(*sup->Stdout("env"), "forty-two\n");
}

// --- The supervisor as a process -------------------------------------------------------------

// Run by the tests below in a re-executed copy of this binary (KVO_SUPERVISOR_HELPER=<dir>):
// two servers and a long task under a Supervisor; prints their pids as its listening line, then
// waits for the task until a termination signal ends the wait, stops everything and exits 143.
TEST(SupervisorHelper, RunAsSupervisorProcess) {
  const char* dir = std::getenv("KVO_SUPERVISOR_HELPER");
  if (dir == nullptr) GTEST_SKIP() << "run by SupervisorProcessTest";
  ASSERT_TRUE(Supervisor::InstallSignalHandlers().ok());
  auto sup = MakeSupervisor(dir);
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->Start(Sh("a", std::string(kListen) + "; exec sleep 600")).ok());
  ASSERT_TRUE(sup->Start(Sh("b", std::string(kListen) + "; exec sleep 600")).ok());
  ASSERT_TRUE(sup->WaitListening("a", seconds(20)).ok());
  ASSERT_TRUE(sup->WaitListening("b", seconds(20)).ok());
  ASSERT_TRUE(sup->Start(Sh("task", "exec sleep 600", ChildRole::kTask)).ok());
  std::printf("{\"event\":\"listening\",\"pids\":[%d,%d,%d]}\n", sup->Pid("a"), sup->Pid("b"),
              sup->Pid("task"));
  std::fflush(stdout);
  auto r = sup->WaitExit("task", seconds(120));
  sup->StopAll();
  std::fprintf(stderr, "helper: %s\n", r.status().ToString().c_str());
  std::fflush(stderr);
  std::_Exit(r.status().code() == StatusCode::kCancelled ? 143 : 1);
}

struct Helper {
  std::unique_ptr<testing::ChildProcess> proc;
  std::vector<pid_t> pids;
  std::vector<int> pidfds;
};

Helper StartHelper(const std::string& dir) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  EXPECT_GT(n, 0);
  self[n > 0 ? n : 0] = '\0';
  Helper h;
  h.proc = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{"/usr/bin/env", "KVO_SUPERVISOR_HELPER=" + dir, self,
                               "--gtest_filter=SupervisorHelper.RunAsSupervisorProcess"});
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (auto line = h.proc->ReadStdoutLine(deadline)) {
    if (line->find("\"pids\"") == std::string::npos) continue;
    auto j = ParseJson(*line);
    if (!j.ok()) break;
    for (const auto& p : (*j)["pids"]) {
      h.pids.push_back(p.get<pid_t>());
      h.pidfds.push_back(static_cast<int>(::syscall(SYS_pidfd_open, h.pids.back(), 0)));
    }
    break;
  }
  EXPECT_EQ(h.pids.size(), 3u) << h.proc->err();
  return h;
}

TEST(SupervisorProcessTest, SigtermStopsEveryChildAndExits) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  testing::TempDir dir;
  Helper h = StartHelper(dir.path());
  ASSERT_EQ(h.pids.size(), 3u);
  h.proc->Signal(SIGTERM);
  const int code = h.proc->Wait(std::chrono::steady_clock::now() + seconds(30));
  EXPECT_EQ(code, 143) << h.proc->err();
  EXPECT_NE(h.proc->err().find("interrupted by SIGTERM"), std::string::npos) << h.proc->err();
  for (size_t i = 0; i < h.pids.size(); ++i) {
    ASSERT_GE(h.pidfds[i], 0);
    EXPECT_TRUE(Exited(h.pidfds[i], milliseconds(100))) << "pid " << h.pids[i] << " left running";
    ::close(h.pidfds[i]);
    EXPECT_FALSE(Alive(h.pids[i]));
  }
}

TEST(SupervisorProcessTest, Kill9OfTheSupervisorLeavesNoOrphan) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // the orphans are reparented to us
  testing::TempDir dir;
  Helper h = StartHelper(dir.path());
  ASSERT_EQ(h.pids.size(), 3u);
  h.proc->Signal(SIGKILL);
  h.proc->Wait(std::chrono::steady_clock::now() + seconds(30));
  for (size_t i = 0; i < h.pids.size(); ++i) {
    ASSERT_GE(h.pidfds[i], 0);
    EXPECT_TRUE(Exited(h.pidfds[i], seconds(10))) << "pid " << h.pids[i] << " orphaned";
    ::close(h.pidfds[i]);
    ::waitpid(h.pids[i], nullptr, WNOHANG);
    EXPECT_FALSE(Alive(h.pids[i]));
  }
}

}  // namespace
}  // namespace kvo
