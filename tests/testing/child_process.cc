#include "tests/testing/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace kvo::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, bool stdin_pipe) {
  int in[2] = {-1, -1};
  int out[2];
  if ((stdin_pipe && ::pipe(in) != 0) || ::pipe(out) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return;
  }
  // Stderr goes to an in-memory file, not a pipe: a child that logs more than a pipe holds while
  // the test is not reading would block in write() (kvo's logger holding its console mutex, so
  // every thread that logs stops with it). The file grows instead; err() reads what is new.
  err_fd_ = ::memfd_create("kvo-child-stderr", MFD_CLOEXEC);
  if (err_fd_ < 0) {
    ADD_FAILURE() << "memfd_create: " << std::strerror(errno);
    return;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // fork + exec rather than posix_spawn: the child asks to be killed when this process dies
  // (PR_SET_PDEATHSIG), so a test aborted by a sanitizer or a crash leaves no daemon behind. The
  // child runs only async-signal-safe calls; an exec failure comes back through a CLOEXEC pipe.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return;
  }
  const pid_t parent = ::getpid();
  const int null_fd = stdin_pipe ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    ::dup2(stdin_pipe ? in[0] : null_fd, 0);
    ::dup2(out[1], 1);
    ::dup2(err_fd_, 2);
    if (stdin_pipe) {
      ::close(in[0]);
      ::close(in[1]);
    }
    ::close(out[0]);
    ::close(out[1]);
    ::execve(args[0], args.data(), environ);
    const int e = errno;
    (void)!::write(report[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(report[1]);
  if (null_fd >= 0) ::close(null_fd);
  int rc = pid_ < 0 ? errno : 0;
  if (pid_ > 0) {
    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(report[0], &child_errno, sizeof child_errno);
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof child_errno)) {
      rc = child_errno;
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  ::close(report[0]);
  if (stdin_pipe) ::close(in[0]);
  ::close(out[1]);
  in_fd_ = in[1];
  out_fd_ = out[0];
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(rc);
    pid_ = -1;
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
  }
  for (int fd : {in_fd_, out_fd_, err_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && !status_) ::kill(pid_, sig);
}

void ChildProcess::WriteStdin(const std::string& text) {
  size_t done = 0;
  while (in_fd_ >= 0 && done < text.size()) {
    const ssize_t n = ::write(in_fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ADD_FAILURE() << "write to child " << pid_ << " stdin: " << std::strerror(errno);
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void ChildProcess::Drain() {
  // Reads while stdout has something, without waiting. (It used to pump with a deadline 1 ms
  // away, which Pump's whole-millisecond rounding turned into "already passed": it read nothing,
  // and stderr was a pipe then, so a daemon logging more than a pipe holds blocked in write(), and
  // with it every thread that logs, while DrainWhile's call waited for an answer.)
  while (PumpFor(0)) {
  }
}

const std::string& ChildProcess::err() const {
  if (err_fd_ < 0) return err_;
  char buf[65536];
  while (true) {
    const ssize_t got = ::pread(err_fd_, buf, sizeof buf, static_cast<off_t>(err_.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    err_.append(buf, static_cast<size_t>(got));
  }
  return err_;
}

std::optional<std::string> ChildProcess::ReadStdoutLine(SteadyClock::time_point deadline) {
  while (true) {
    const size_t nl = out_.find('\n', out_pos_);
    if (nl != std::string::npos) {
      std::string line = out_.substr(out_pos_, nl - out_pos_);
      out_pos_ = nl + 1;
      return line;
    }
    if (!Pump(deadline)) return std::nullopt;
  }
}

int ChildProcess::Wait(SteadyClock::time_point deadline) {
  if (pid_ <= 0) return -1;
  if (in_fd_ >= 0) {
    ::close(in_fd_);
    in_fd_ = -1;
  }
  while (out_fd_ >= 0) {
    if (!Pump(deadline)) break;
  }
  if (out_fd_ >= 0) {
    ADD_FAILURE() << "child " << pid_
                  << " still running at the deadline; killing it\nstderr: " << err();
    ::kill(pid_, SIGKILL);
  }
  int st = 0;
  ::waitpid(pid_, &st, 0);
  status_ = st;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool ChildProcess::Pump(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  if (left.count() <= 0) return false;
  return PumpFor(static_cast<int>(left.count()));
}

bool ChildProcess::PumpFor(int timeout_ms) {
  if (out_fd_ < 0) return false;
  pollfd fd = {out_fd_, POLLIN, 0};
  const int r = ::poll(&fd, 1, timeout_ms);
  if (r < 0 && errno == EINTR) return true;
  if (r <= 0) return false;
  char buf[65536];
  const ssize_t got = ::read(out_fd_, buf, sizeof buf);
  if (got < 0 && errno == EINTR) return true;
  if (got > 0) {
    out_.append(buf, static_cast<size_t>(got));
  } else {
    ::close(out_fd_);
    out_fd_ = -1;
  }
  return true;
}

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  ChildProcess child(argv);
  CommandResult r;
  if (!child.started()) return r;
  r.code = child.Wait(SteadyClock::now() + timeout);
  r.out = child.out();
  r.err = child.err();
  return r;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

}  // namespace kvo::testing
