// ChildProcess: run a program (usually the real `kvo` binary) with stdout on a pipe and stderr in
// an in-memory file, read its output line by line with a deadline, signal it, and reap it. Tests
// synchronise on what the child prints or on its exit; deadlines exist only to turn a hang into a
// failure.
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

  // Reads stdout to EOF and reaps the child. Returns the exit code; -1 when it was killed by
  // a signal or the deadline passed (then the child is SIGKILLed and the test fails).
  int Wait(SteadyClock::time_point deadline);

  // Reads whatever stdout holds now (keeps a child that prints a lot from blocking on a full pipe;
  // stderr never blocks: it is a file).
  void Drain();

  // Runs `call` on a thread of its own while this one reads stdout, and returns its result: a
  // child that prints more than a pipe holds while the call waits on it would otherwise block
  // writing and never answer.
  template <class F>
  auto DrainWhile(F&& call) {
    auto result = std::async(std::launch::async, std::forward<F>(call));
    do {
      Drain();
    } while (result.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready);
    Drain();
    return result.get();
  }

  // Stdout not yet returned by ReadStdoutLine, and all of stderr so far (read when called; not
  // to be called while another thread uses this object).
  std::string out() const { return out_.substr(out_pos_); }
  const std::string& err() const;

 private:
  // Waits until `deadline` for stdout to have something and reads it once; false when the
  // deadline passed or stdout is closed.
  bool Pump(SteadyClock::time_point deadline);
  // The same with a timeout in milliseconds; 0 does not wait.
  bool PumpFor(int timeout_ms);

  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;  // the child's stderr (memfd); read by err() from err_.size() on
  std::string out_;
  size_t out_pos_ = 0;
  mutable std::string err_;
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
