// ChildProcess: run a program (usually the real `kvo` binary) with stdout and stderr on pipes,
// read its output line by line with a deadline, signal it, and reap it. Tests synchronise on what
// the child prints or on its exit; deadlines exist only to turn a hang into a failure.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvo::testing {

using SteadyClock = std::chrono::steady_clock;

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv. Stdin is /dev/null, or with `stdin_pipe` a pipe the test
  // writes with WriteStdin (closed by Wait). A failure to start is a test failure. The child is
  // SIGKILLed when the creating *thread* ends (PR_SET_PDEATHSIG), so a test process that aborts
  // leaves no daemon behind: create children on the test's main thread.
  explicit ChildProcess(const std::vector<std::string>& argv, bool stdin_pipe = false);
  // SIGKILLs and reaps the child if it is still running, so a failed assertion leaves nothing.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  void WriteStdin(const std::string& text);

  // The next complete stdout line, or nullopt at EOF or when `deadline` passes.
  std::optional<std::string> ReadStdoutLine(SteadyClock::time_point deadline);

  // Reads both pipes to EOF and reaps the child. Returns the exit code; -1 when it was killed by
  // a signal or the deadline passed (then the child is SIGKILLed and the test fails).
  int Wait(SteadyClock::time_point deadline);

  // Reads whatever the pipes hold now (keeps a chatty child from blocking on a full pipe).
  void Drain();

  // Runs `call` on a thread of its own while this one reads the pipes, and returns its result: a
  // child that writes more than a pipe holds while the call waits on it (an HTTP call to a daemon
  // logging every refused stream) would otherwise block writing and never answer.
  template <class F>
  auto DrainWhile(F&& call) {
    auto result = std::async(std::launch::async, std::forward<F>(call));
    do {
      Drain();
    } while (result.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready);
    Drain();
    return result.get();
  }

  // Stdout not yet returned by ReadStdoutLine, and all of stderr so far.
  std::string out() const { return out_.substr(out_pos_); }
  const std::string& err() const { return err_; }

 private:
  // Waits until `deadline` for a pipe to have something and reads it once; false when it passed
  // (or, with want_stdout, when stdout is closed).
  bool Pump(SteadyClock::time_point deadline, bool want_stdout);
  // The same with a timeout in milliseconds; 0 does not wait.
  bool PumpFor(int timeout_ms, bool want_stdout);

  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  size_t out_pos_ = 0;
  std::string err_;
  std::optional<int> status_;
};

struct CommandResult {
  int code = -1;  // exit code; -1 when killed by a signal or past the deadline
  std::string out;
  std::string err;
};

// Runs argv to completion (failure guard: `timeout`).
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::seconds timeout = std::chrono::seconds(120));

// `text` split at '\n' (no trailing empty line).
std::vector<std::string> SplitLines(const std::string& text);

// Runs `body` in a forked child of this process; its return value (0: passed, else the failed
// step) is the child's exit status, -1 when the child could not run or did not exit. Only
// async-signal-safe work in the child beyond the syscalls under test.
inline int InForkedChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace kvo::testing
