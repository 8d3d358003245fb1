// TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
#pragma once

#include <string>

#include "common/file_system.h"

namespace kvo::testing {

// Aborts when the directory cannot be created (every test needs it).
class TempDir : public ScopedTempDir {
 public:
  TempDir();
};

// Seed for randomised tests: $KVO_TEST_SEED when set, else random; printed so failures replay.
unsigned TestSeed();

}  // namespace kvo::testing
