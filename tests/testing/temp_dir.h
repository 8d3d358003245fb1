// TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
#pragma once

#include <string>

namespace kvo::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Seed for randomised tests: $KVO_TEST_SEED when set, else random; printed so failures replay.
unsigned TestSeed();

}  // namespace kvo::testing
