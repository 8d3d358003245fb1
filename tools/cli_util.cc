#include "tools/cli_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace kvo::cli {

int ReportError(const Status& status) {
  std::fprintf(stderr, "kvo: %s\n", status.ToString().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int ExitStatusOf(const Status& status) { return status.ok() ? 0 : ReportError(status); }

int ExitStatusOf(const ExitCode& code) { return code.ok() ? *code : ReportError(code.status()); }

void CommandTable::Add(const CLI::App* cmd, Action run) {
  actions_.emplace_back(cmd, std::move(run));
}

void CommandTable::AddStatus(const CLI::App* cmd, std::function<Status()> run) {
  Add(cmd, [run = std::move(run)]() -> ExitCode {
    KVO_RETURN_IF_ERROR(run());
    return 0;
  });
}

int CommandTable::RunParsed() const {
  for (const auto& [cmd, run] : actions_) {
    if (cmd->parsed()) return ExitStatusOf(run());
  }
  return 0;
}

sigset_t BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForTerminationSignal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

int LingerUntilSignal(const sigset_t& set, int64_t ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno != EINTR && errno != EAGAIN) return 0;
  }
}

Result<std::string> ReadInputFile(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::InvalidArgument(std::string("cannot open ") + what + " '" + path +
                                   "': " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(std::string(what) + " '" + path +
                                   "' is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(std::string("cannot open ") + what + " '" + path +
                                   "': " + std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return Status::IOError(std::string("cannot read ") + what + " '" + path + "'");
  }
  return ss.str();
}

void PrintLine(std::string_view line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  if (line.empty() || line.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace kvo::cli
