// A process supervisor for `kvo demo`: runs child processes (servers and tasks), captures their
// output to log files, waits for a server's one-line JSON `{"event":"listening",...}` on stdout,
// notices a child that dies (which and why, with the last lines of its log) and stops everything
// on request, on a failure or on SIGINT/SIGTERM — no hang, no orphan.
//
// Children:
//   * are started with fork + execve of an absolute path (no shell, no PATH search); stdin is
//     /dev/null, stdout a pipe the supervisor drains into `<log_dir>/<name>.out` (and keeps in
//     memory, bounded), stderr the file `<log_dir>/<name>.log`. An execve that fails is reported
//     by Start (errno through a close-on-exec pipe), not as a child that exits 127.
//   * lead a process group of their own (setpgid), so a stop signal reaches whatever they spawn,
//     and a terminal's Ctrl-C reaches the supervisor only, which stops them in order.
//   * die with the supervisor: PR_SET_PDEATHSIG(SIGKILL). Linux ties it to the *thread* that
//     forked, so call Start from a thread that outlives the children (the main thread).
//
// Roles: a kServer must keep running until stopped; its exit (any code) is a failure. A kTask
// (e.g. `kvo load`) runs to completion; exit code 0 is success, anything else a failure.
// Every wait (WaitListening, WaitExit, Check) reports the first failure of any child, so a
// server that dies while a task runs ends the wait at once, naming the server.
//
// State machine of a child: running --(pidfd readable: reaped by the monitor)--> exited.
// Stop: SIGTERM to the group, up to `stop_grace`, then SIGKILL to the group; always reaped.
//
// Threading: one monitor thread polls every child's stdout pipe and pidfd, the wake pipe and the
// termination-signal pipe, and records what it sees under `mu_`; the public calls wait on a
// condition variable with a deadline (no sleeps). The public calls are thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace kvo {

enum class ChildRole { kServer, kTask };

struct ChildSpec {
  std::string name;               // unique; [A-Za-z0-9._-]+, names the log files
  std::vector<std::string> argv;  // argv[0]: absolute path of the program
  std::vector<std::string> env;   // "KEY=VALUE" added to (or replacing in) this environment
  ChildRole role = ChildRole::kServer;
};

// How a child ended.
struct ChildExit {
  int exit_code = -1;  // >= 0 when it exited
  int signal = 0;      // > 0 when a signal killed it
  bool ok() const { return exit_code == 0; }
  // "exit code 3" | "killed by signal 9 (SIGKILL)"
  std::string Describe() const;
};

struct SupervisorOptions {
  std::string log_dir;                         // must exist
  int tail_lines = 12;                         // lines of a failed child's log quoted in the error
  std::chrono::milliseconds stop_grace{3000};  // SIGTERM, then SIGKILL after this
  size_t max_stdout_bytes = 16u << 20;         // kept in memory per child (the file has all)
};

class Supervisor {
 public:
  // Starts the monitor thread. InvalidArgument when log_dir is not a directory.
  static Result<std::unique_ptr<Supervisor>> Create(SupervisorOptions options);
  // StopAll, then joins the monitor.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Spawns a child. InvalidArgument for a bad or duplicate name or an empty argv; the errno text
  // when the program cannot be executed.
  Status Start(const ChildSpec& spec);

  // Waits for `name`'s first stdout line that is a JSON object with "event": "listening" and
  // returns that line. Fails when: that child exits first; another child fails; SIGINT/SIGTERM
  // arrives (Cancelled); `timeout` passes (Unavailable naming the child and the timeout). Each
  // failure names the child and quotes the last lines of its log.
  Result<std::string> WaitListening(std::string_view name, std::chrono::milliseconds timeout);

  // Waits for `name` to exit and returns how (a task's non-zero code is returned, not an error).
  // Fails on another child's failure, a termination signal, or the timeout.
  Result<ChildExit> WaitExit(std::string_view name, std::chrono::milliseconds timeout);

  // Ok while no child has failed and no termination signal arrived; else the first failure.
  Status Check();

  // Stdout captured so far (bounded by max_stdout_bytes; the .out file has everything).
  Result<std::string> Stdout(std::string_view name);
  // The last `lines` lines of the child's stderr log ("" when empty).
  std::string LogTail(std::string_view name, int lines);
  // Log files of a child.
  std::string LogPath(std::string_view name) const;
  std::string StdoutPath(std::string_view name) const;
  // 0 when unknown.
  pid_t Pid(std::string_view name);

  // Stops one child (its exit is then expected) and waits for it to be reaped.
  Status Stop(std::string_view name);
  // Stops every running child, in reverse start order: SIGTERM to each group, then SIGKILL to
  // those still running after stop_grace; waits until every child is reaped. Idempotent.
  void StopAll();

  // Process-wide, once: SIGINT and SIGTERM no longer kill this process; they end every
  // Supervisor's waits with Cancelled ("interrupted by SIGTERM"). SIGPIPE is ignored.
  static Status InstallSignalHandlers();
  // The termination signal received (0: none).
  static int TerminationSignal();

 private:
  struct Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo
