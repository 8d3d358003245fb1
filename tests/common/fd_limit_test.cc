// RaiseFdLimit and FdLimitNote in child processes whose limits the test lowers (the test process's
// own limits are left alone).
#include "common/fd_limit.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <functional>
#include <string>
#include <vector>

#include "tests/testing/child_process.h"

namespace kvo {
namespace {

using testing::InForkedChild;

// Opens descriptors (dup of stdin's /dev/null) until EMFILE or `bound`; how many were opened.
int OpenUntilRefused(int bound, int* err) {
  const int base = ::open("/dev/null", O_RDONLY);
  if (base < 0) return *err = errno, 0;
  int opened = 1;
  for (; opened < bound; ++opened) {
    if (::dup(base) < 0) return *err = errno, opened;
  }
  *err = 0;
  return opened;
}

TEST(FdLimitTest, RaiseLiftsTheSoftLimitToTheHardLimit) {
  auto now = CurrentFdLimit();
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  if (now->hard < 256) GTEST_SKIP() << "hard limit " << now->hard << " too low to lower from";
  EXPECT_EQ(InForkedChild([] {
              rlimit rl{};
              if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
              rl.rlim_cur = 64;  // as `ulimit -Sn 64`
              if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 2;
              int err = 0;
              if (OpenUntilRefused(200, &err) >= 200 || err != EMFILE) return 3;
              auto raised = RaiseFdLimit();
              if (!raised.ok()) return 4;
              const uint64_t hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
              if (raised->soft != hard || raised->hard != hard) return 5;
              // 200 more descriptors now open (the 64 above are still held).
              if (OpenUntilRefused(200, &err) != 200) return 6;
              return 0;
            }),
            0);
}

TEST(FdLimitTest, AtTheHardLimitRaiseChangesNothingAndTheNoteNamesTheLimit) {
  EXPECT_EQ(InForkedChild([] {
              rlimit rl{48, 48};  // as `ulimit -n 48`: soft and hard
              if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
              auto raised = RaiseFdLimit();
              if (!raised.ok() || raised->soft != 48 || raised->hard != 48) return 2;
              int err = 0;
              if (OpenUntilRefused(100, &err) >= 48 || err != EMFILE) return 3;
              const std::string note = FdLimitNote();
              if (note.find("RLIMIT_NOFILE") == std::string::npos) return 4;
              if (note.find("is 48 (hard 48)") == std::string::npos) return 5;
              if (note.find("ulimit -n") == std::string::npos) return 6;
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace kvo
