#include "supervisor/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include "common/json.h"
#include "common/mutex.h"

extern char** environ;

namespace kvo {
namespace {

using Clock = std::chrono::steady_clock;

// Process-wide termination signal: the handler records the signal and writes one byte to a pipe
// that is never drained nor closed, so every monitor's poll sees it (level-triggered) without a
// race on file descriptors that come and go.
std::atomic<int> g_signal{0};
std::atomic<int> g_signal_pipe_r{-1};
int g_signal_pipe_w = -1;

void OnTerminationSignal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  if (g_signal_pipe_w >= 0) {
    const char b = 's';
    ssize_t n = ::write(g_signal_pipe_w, &b, 1);
    (void)n;
  }
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::string ErrnoText(int err) { return std::strerror(err); }

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The last `lines` lines of a file (reads at most its last 64 KiB).
std::string FileTail(const std::string& path, int lines) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return {};
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const off_t want = std::min<off_t>(st.st_size, 64 << 10);
    text.resize(static_cast<size_t>(want));
    ssize_t n = ::pread(fd, text.data(), text.size(), st.st_size - want);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t pos = text.size();
  for (int i = 0; i < lines && pos != std::string::npos && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
  }
  if (pos == std::string::npos) return text;
  return pos == 0 && text[0] != '\n' ? text : text.substr(pos + 1);
}

std::string Indent(const std::string& text) {
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

}  // namespace

std::string ChildExit::Describe() const {
  if (signal > 0)
    return "killed by signal " + std::to_string(signal) + " (" + SignalName(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

struct Supervisor::Impl {
  struct Child {
    ChildSpec spec;
    pid_t pid = 0;
    int pidfd = -1;
    int out_fd = -1;    // read end of the stdout pipe (non-blocking); -1 after EOF
    int out_file = -1;  // <name>.out
    std::string out;    // bounded copy of stdout
    std::string partial_line;
    bool listening = false;
    std::string listening_line;
    bool exited = false;
    ChildExit exit;
    bool stop_requested = false;
  };

  SupervisorOptions options;
  Mutex mu;
  CondVar cv{&mu};
  std::vector<std::unique_ptr<Child>> children GUARDED_BY(mu);
  bool shutdown GUARDED_BY(mu) = false;
  int wake_r = -1, wake_w = -1;
  std::thread monitor;

  ~Impl() {
    CloseFd(wake_r);
    CloseFd(wake_w);
  }

  void Wake() {
    const char b = 'w';
    ssize_t n = ::write(wake_w, &b, 1);
    (void)n;
  }

  Child* Find(std::string_view name) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto& c : children) {
      if (c->spec.name == name) return c.get();
    }
    return nullptr;
  }

  std::string LogPathOf(std::string_view name) const {
    return options.log_dir + "/" + std::string(name) + ".log";
  }
  std::string OutPathOf(std::string_view name) const {
    return options.log_dir + "/" + std::string(name) + ".out";
  }

  std::string Tail(const Child& c) const {
    std::string t = FileTail(LogPathOf(c.spec.name), options.tail_lines);
    std::string where = LogPathOf(c.spec.name);
    if (t.empty()) {
      t = FileTail(OutPathOf(c.spec.name), options.tail_lines);
      where = OutPathOf(c.spec.name);
    }
    if (t.empty()) return "; its log " + LogPathOf(c.spec.name) + " is empty";
    return "; last lines of " + where + ":\n" + Indent(t);
  }

  // A child that ended when it should not have (a server; a task with a non-zero code).
  static bool Failed(const Child& c) {
    if (!c.exited || c.stop_requested) return false;
    return c.spec.role == ChildRole::kServer || !c.exit.ok();
  }

  std::string Describe(const Child& c, std::string_view what) const {
    return c.spec.name + " (pid " + std::to_string(c.pid) + ", `" + c.spec.argv[0] + "`) " +
           std::string(what) + ": " + c.exit.Describe() + Tail(c);
  }

  Status FirstFailure(const Child* except) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (int sig = g_signal.load(); sig != 0) {
      return Status::Cancelled("interrupted by " + SignalName(sig));
    }
    for (auto& c : children) {
      if (c.get() == except || !Failed(*c)) continue;
      return Status::Unavailable(
          Describe(*c, c->spec.role == ChildRole::kServer ? "exited unexpectedly" : "failed"));
    }
    return Status::Ok();
  }

  // Lines of stdout: the first JSON object with "event": "listening" marks the child ready.
  void OnStdout(Child& c, const char* data, size_t n) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (c.out.size() < options.max_stdout_bytes) {
      c.out.append(data, std::min(n, options.max_stdout_bytes - c.out.size()));
    }
    if (c.listening) return;
    c.partial_line.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = c.partial_line.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(c.partial_line.data() + start, nl - start);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      if (line.empty() || line.front() != '{') continue;
      auto j = ParseJson(line, "listening line");
      if (j.ok() && j->is_object() && j->contains("event") && (*j)["event"] == "listening") {
        c.listening = true;
        c.listening_line = std::string(line);
        c.partial_line.clear();
        return;
      }
    }
    c.partial_line.erase(0, start);
    if (c.partial_line.size() > (64u << 10)) c.partial_line.clear();  // no line that long
  }

  // Reads what the pipe holds now. Returns false at EOF (or on an error).
  bool DrainStdout(Child& c) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(c.out_fd, buf, sizeof buf);
      if (n > 0) {
        if (c.out_file >= 0) {
          for (ssize_t off = 0; off < n;) {
            ssize_t w = ::write(c.out_file, buf + off, static_cast<size_t>(n - off));
            if (w <= 0) break;
            off += w;
          }
        }
        MutexLock l(&mu);
        OnStdout(c, buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
  }

  // The leader died: its pid is held by the zombie until reaped, so its group id cannot be
  // reused yet; anything left in the group is killed, then the leader is reaped.
  void Reap(Child& c) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid == 0) {
      return;  // not exited yet (a spurious wake-up)
    }
    ::kill(-c.pid, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(c.pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (c.out_fd >= 0 && !DrainStdout(c)) CloseFd(c.out_fd);
    MutexLock l(&mu);
    c.exited = true;
    if (r == c.pid && WIFEXITED(status)) c.exit.exit_code = WEXITSTATUS(status);
    if (r == c.pid && WIFSIGNALED(status)) c.exit.signal = WTERMSIG(status);
    CloseFd(c.pidfd);
    cv.SignalAll();
  }

  void Monitor() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> who;  // (child, is_pidfd) per fds entry from index 2
    for (;;) {
      fds.clear();
      who.clear();
      {
        MutexLock l(&mu);
        if (shutdown) return;
        fds.push_back({wake_r, POLLIN, 0});
        const int sig_fd = g_signal.load() == 0 ? g_signal_pipe_r.load() : -1;
        fds.push_back({sig_fd, POLLIN, 0});
        for (auto& c : children) {
          if (c->out_fd >= 0) {
            fds.push_back({c->out_fd, POLLIN, 0});
            who.emplace_back(c.get(), false);
          }
          if (!c->exited && c->pidfd >= 0) {
            fds.push_back({c->pidfd, POLLIN, 0});
            who.emplace_back(c.get(), true);
          }
        }
      }
      int n = ::poll(fds.data(), fds.size(), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) {
        char buf[256];
        while (::read(wake_r, buf, sizeof buf) > 0) {
        }
      }
      if (fds[1].fd >= 0 && fds[1].revents != 0) {
        MutexLock l(&mu);
        cv.SignalAll();  // waiters read g_signal
      }
      // Stdout first, so a listening line written just before death is seen.
      for (size_t i = 2; i < fds.size(); ++i) {
        auto [c, is_pidfd] = who[i - 2];
        if (fds[i].revents == 0 || is_pidfd) continue;
        if (!DrainStdout(*c)) {
          MutexLock l(&mu);
          CloseFd(c->out_fd);
          cv.SignalAll();
        } else {
          MutexLock l(&mu);
          cv.SignalAll();
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        auto [c, is_pidfd] = who[i - 2];
        if (fds[i].revents != 0 && is_pidfd) Reap(*c);
      }
    }
  }

  template <class Pred>
  Status WaitFor(Child* c, std::chrono::milliseconds timeout, std::string_view what, Pred done)
      EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (int sig = g_signal.load(); sig != 0) {
        return Status::Cancelled("interrupted by " + SignalName(sig) + " while waiting for " +
                                 c->spec.name + " " + std::string(what));
      }
      if (done(*c)) return Status::Ok();
      KVO_RETURN_IF_ERROR(FirstFailure(c));
      if (c->exited) return Status::Unavailable(Describe(*c, "exited before " + std::string(what)));
      const auto now = Clock::now();
      if (now >= deadline) {
        return Status::Unavailable(c->spec.name + " (pid " + std::to_string(c->pid) + ") not " +
                                   std::string(what) + " within " +
                                   std::to_string(timeout.count()) + " ms" + Tail(*c));
      }
      cv.WaitFor(std::min<Clock::duration>(deadline - now, std::chrono::seconds(1)));
    }
  }

  void SignalGroups(const std::vector<Child*>& list, int sig) {
    for (Child* c : list) ::kill(-c->pid, sig);
  }

  // Waits until every child of `list` is reaped or the deadline passes; true when all are.
  bool WaitReaped(const std::vector<Child*>& list, Clock::time_point deadline)
      EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (;;) {
      bool all = std::all_of(list.begin(), list.end(), [](Child* c) { return c->exited; });
      if (all) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      cv.WaitFor(deadline - now);
    }
  }

  void StopList(std::vector<Child*> list) {
    {
      MutexLock l(&mu);
      std::erase_if(list, [](Child* c) { return c->exited; });
      for (Child* c : list) c->stop_requested = true;
    }
    if (list.empty()) return;
    SignalGroups(list, SIGTERM);
    {
      MutexLock l(&mu);
      if (WaitReaped(list, Clock::now() + options.stop_grace)) return;
      std::erase_if(list, [](Child* c) { return c->exited; });
    }
    SignalGroups(list, SIGKILL);
    MutexLock l(&mu);
    // SIGKILL cannot be refused; only a process stuck in the kernel (D state) outlives this.
    WaitReaped(list, Clock::now() + std::chrono::seconds(30));
  }
};

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Supervisor>> Supervisor::Create(SupervisorOptions options) {
  struct stat st {};
  if (options.log_dir.empty() || ::stat(options.log_dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("supervisor: log_dir '" + options.log_dir +
                                   "' is not a directory");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::IOError("supervisor: pipe2: " + ErrnoText(errno));
  }
  impl->wake_r = p[0];
  impl->wake_w = p[1];
  Impl* raw = impl.get();
  impl->monitor = std::thread([raw] { raw->Monitor(); });
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

Supervisor::~Supervisor() {
  StopAll();
  {
    MutexLock l(&impl_->mu);
    impl_->shutdown = true;
  }
  impl_->Wake();
  impl_->monitor.join();
  MutexLock l(&impl_->mu);
  for (auto& c : impl_->children) {
    CloseFd(c->out_fd);
    CloseFd(c->out_file);
    CloseFd(c->pidfd);
  }
}

Status Supervisor::Start(const ChildSpec& spec) {
  if (!ValidName(spec.name)) {
    return Status::InvalidArgument("supervisor: child name '" + spec.name +
                                   "' must be 1-64 characters of [A-Za-z0-9._-]");
  }
  if (spec.argv.empty() || spec.argv[0].empty() || spec.argv[0][0] != '/') {
    return Status::InvalidArgument("supervisor: " + spec.name +
                                   ": argv[0] must be an absolute path");
  }
  {
    MutexLock l(&impl_->mu);
    if (impl_->Find(spec.name) != nullptr) {
      return Status::InvalidArgument("supervisor: a child named " + spec.name + " exists");
    }
  }
  if (int sig = g_signal.load(); sig != 0) {
    return Status::Cancelled("interrupted by " + SignalName(sig));
  }
  auto c = std::make_unique<Impl::Child>();
  c->spec = spec;

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    std::string_view key = kv.substr(0, kv.find('='));
    bool replaced = std::any_of(spec.env.begin(), spec.env.end(), [&](const std::string& o) {
      return std::string_view(o).substr(0, o.find('=')) == key;
    });
    if (!replaced) env_store.emplace_back(kv);
  }
  for (const std::string& o : spec.env) env_store.push_back(o);
  std::vector<char*> envp;
  envp.reserve(env_store.size() + 1);
  for (std::string& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  const std::string log_path = impl_->LogPathOf(spec.name);
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return Status::IOError("supervisor: cannot open " + log_path + ": " + ErrnoText(errno));
  const std::string out_path = impl_->OutPathOf(spec.name);
  c->out_file = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  auto cleanup = [&] {
    CloseFd(log_fd);
    CloseFd(null_fd);
    CloseFd(out_pipe[0]);
    CloseFd(out_pipe[1]);
    CloseFd(err_pipe[0]);
    CloseFd(err_pipe[1]);
    CloseFd(c->out_file);
  };
  if (c->out_file < 0 || null_fd < 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    Status s =
        Status::IOError("supervisor: cannot set up " + spec.name + "'s files: " + ErrnoText(errno));
    cleanup();
    return s;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    Status s = Status::Unavailable("supervisor: fork for " + spec.name + ": " + ErrnoText(errno));
    cleanup();
    return s;
  }
  if (pid == 0) {
    // The child: own process group; killed when the forking thread of the supervisor ends.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the supervisor died before prctl
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT}) {
      ::sigaction(sig, &dfl, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::dup2(null_fd, 0) < 0 || ::dup2(out_pipe[1], 1) < 0 || ::dup2(log_fd, 2) < 0) {
      int err = errno;
      ssize_t w = ::write(err_pipe[1], &err, sizeof err);
      (void)w;
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    int err = errno;
    ssize_t w = ::write(err_pipe[1], &err, sizeof err);
    (void)w;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so a signal sent right after Start reaches the group
  CloseFd(out_pipe[1]);
  CloseFd(err_pipe[1]);
  CloseFd(log_fd);
  CloseFd(null_fd);
  int child_errno = 0;
  ssize_t got;
  do {
    got = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  } while (got < 0 && errno == EINTR);
  CloseFd(err_pipe[0]);
  if (got > 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    CloseFd(out_pipe[0]);
    CloseFd(c->out_file);
    return Status::InvalidArgument("supervisor: cannot run " + spec.name + " (`" + spec.argv[0] +
                                   "`): " + ErrnoText(child_errno));
  }
  c->pid = pid;
  c->pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (c->pidfd < 0) {
    int err = errno;
    ::kill(-pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    CloseFd(out_pipe[0]);
    CloseFd(c->out_file);
    return Status::Unavailable("supervisor: pidfd_open: " + ErrnoText(err));
  }
  ::fcntl(c->pidfd, F_SETFD, FD_CLOEXEC);
  ::fcntl(out_pipe[0], F_SETFL, ::fcntl(out_pipe[0], F_GETFL) | O_NONBLOCK);
  c->out_fd = out_pipe[0];
  {
    MutexLock l(&impl_->mu);
    impl_->children.push_back(std::move(c));
  }
  impl_->Wake();
  return Status::Ok();
}

Result<std::string> Supervisor::WaitListening(std::string_view name,
                                              std::chrono::milliseconds timeout) {
  MutexLock l(&impl_->mu);
  Impl::Child* c = impl_->Find(name);
  if (c == nullptr) return Status::NotFound("supervisor: no child named " + std::string(name));
  KVO_RETURN_IF_ERROR(
      impl_->WaitFor(c, timeout, "listening", [](const Impl::Child& x) { return x.listening; }));
  return c->listening_line;
}

Result<ChildExit> Supervisor::WaitExit(std::string_view name, std::chrono::milliseconds timeout) {
  MutexLock l(&impl_->mu);
  Impl::Child* c = impl_->Find(name);
  if (c == nullptr) return Status::NotFound("supervisor: no child named " + std::string(name));
  // The awaited child's own exit is the answer, not a failure.
  const bool was_stop = c->stop_requested;
  c->stop_requested = true;
  Status s = impl_->WaitFor(c, timeout, "finished", [](const Impl::Child& x) { return x.exited; });
  if (!s.ok()) {
    c->stop_requested = was_stop;
    return s;
  }
  return c->exit;
}

Status Supervisor::Check() {
  MutexLock l(&impl_->mu);
  return impl_->FirstFailure(nullptr);
}

Result<std::string> Supervisor::Stdout(std::string_view name) {
  MutexLock l(&impl_->mu);
  Impl::Child* c = impl_->Find(name);
  if (c == nullptr) return Status::NotFound("supervisor: no child named " + std::string(name));
  return c->out;
}

std::string Supervisor::LogTail(std::string_view name, int lines) {
  return FileTail(impl_->LogPathOf(name), lines);
}

std::string Supervisor::LogPath(std::string_view name) const { return impl_->LogPathOf(name); }
std::string Supervisor::StdoutPath(std::string_view name) const { return impl_->OutPathOf(name); }

pid_t Supervisor::Pid(std::string_view name) {
  MutexLock l(&impl_->mu);
  Impl::Child* c = impl_->Find(name);
  return c == nullptr ? 0 : c->pid;
}

Status Supervisor::Stop(std::string_view name) {
  Impl::Child* c;
  {
    MutexLock l(&impl_->mu);
    c = impl_->Find(name);
    if (c == nullptr) return Status::NotFound("supervisor: no child named " + std::string(name));
  }
  impl_->StopList({c});
  MutexLock l(&impl_->mu);
  if (!c->exited) {
    return Status::Unavailable("supervisor: " + c->spec.name + " (pid " + std::to_string(c->pid) +
                               ") survived SIGKILL");
  }
  return Status::Ok();
}

void Supervisor::StopAll() {
  std::vector<Impl::Child*> list;
  {
    MutexLock l(&impl_->mu);
    for (auto it = impl_->children.rbegin(); it != impl_->children.rend(); ++it) {
      list.push_back(it->get());
    }
  }
  impl_->StopList(std::move(list));
}

Status Supervisor::InstallSignalHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return Status::Ok();
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    installed = false;
    return Status::IOError("supervisor: pipe2: " + ErrnoText(errno));
  }
  g_signal_pipe_w = p[1];
  g_signal_pipe_r.store(p[0]);
  struct sigaction sa {};
  sa.sa_handler = OnTerminationSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (::sigaction(SIGINT, &sa, nullptr) != 0 || ::sigaction(SIGTERM, &sa, nullptr) != 0) {
    return Status::IOError("supervisor: sigaction: " + ErrnoText(errno));
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, nullptr);
  return Status::Ok();
}

int Supervisor::TerminationSignal() { return g_signal.load(); }

}  // namespace kvo
