#include "common/fd_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace kvo {
namespace {

uint64_t Value(rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(v); }

std::string Text(uint64_t v) { return v == UINT64_MAX ? "unlimited" : std::to_string(v); }

}  // namespace

Result<FdLimit> CurrentFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return Status::IOError(std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
  }
  return FdLimit{Value(rl.rlim_cur), Value(rl.rlim_max)};
}

Result<FdLimit> RaiseFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return Status::IOError(std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
  }
  if (rl.rlim_cur != rl.rlim_max) {
    const rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      const int e = errno;
      return Status::IOError("raising the open-file limit (RLIMIT_NOFILE) from " +
                             Text(Value(old)) + " to its hard limit " + Text(Value(rl.rlim_max)) +
                             ": " + std::strerror(e));
    }
  }
  return CurrentFdLimit();
}

std::string FdLimitNote() {
  auto lim = CurrentFdLimit();
  if (!lim.ok()) return "the process's open-file limit (RLIMIT_NOFILE) is reached";
  return "the process's open-file limit (RLIMIT_NOFILE) is " + Text(lim->soft) + " (hard " +
         Text(lim->hard) + ") and is reached: raise it (ulimit -n, LimitNOFILE= in systemd)";
}

}  // namespace kvo
