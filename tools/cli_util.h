// What every `kvo` command shares: how a command's exit status reaches main(), signal handling
// for the long-running servers, and line output to a pipe. Commands include this and
// tools/commands.h only.
#pragma once

#include <signal.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace kvo::cli {

// What a command returns: the exit status it chose (0 success; a command documents its other
// codes, e.g. 1 when `fs verify` finds corruption), or the error that stopped it.
using ExitCode = Result<int>;

// An error that stopped a command: "kvo: <status>" on stderr; exit status 2 for invalid
// arguments, 1 otherwise.
int ReportError(const Status& status);
// 0 for Ok, else ReportError(status).
int ExitStatusOf(const Status& status);
// The code, or ReportError of the error.
int ExitStatusOf(const ExitCode& code);

// The actions of the subcommands, run after the whole command line parsed. main() owns one;
// each area's Add*Command registers its leaf subcommands' actions in it.
class CommandTable {
 public:
  using Action = std::function<ExitCode()>;
  // `run` is what `cmd` does when it is the subcommand given.
  void Add(const CLI::App* cmd, Action run);
  // A command that ends with a Status: exit status 0, or ReportError of it.
  void AddStatus(const CLI::App* cmd, std::function<Status()> run);
  // Runs the action of the subcommand that parsed and returns its exit status (0 when none did:
  // CLI11 already rejected a command line without one).
  int RunParsed() const;

 private:
  std::vector<std::pair<const CLI::App*, Action>> actions_;
};

// Blocks SIGINT and SIGTERM in this thread and in every thread started after it (call it before
// starting any), so that the caller can take them with WaitForTerminationSignal or
// LingerUntilSignal and shut down cleanly. Returns the set.
sigset_t BlockTerminationSignals();
// Waits for one of `set` (blocked); returns the signal.
int WaitForTerminationSignal(const sigset_t& set);
// Waits up to `ms` or until a signal of `set` (blocked) arrives. Returns the signal, or 0 on
// timeout.
int LingerUntilSignal(const sigset_t& set, int64_t ms);

// The whole of a file a flag names (a regular file, a FIFO or /dev/stdin; not a directory).
// InvalidArgument "cannot open <what> '<path>': <errno text>" or "<what> '<path>' is a directory,
// not a file"; IOError when reading fails.
Result<std::string> ReadInputFile(const std::string& path, const char* what);

// Writes `line` and a newline (unless it ends with one) to stdout and flushes: consumers read the
// output through a pipe.
void PrintLine(std::string_view line);

}  // namespace kvo::cli
