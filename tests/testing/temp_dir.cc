#include "tests/testing/temp_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

namespace kvo::testing {

TempDir::TempDir() : ScopedTempDir("test") {
  if (path().empty()) std::abort();
}

unsigned TestSeed() {
  unsigned seed;
  if (const char* s = std::getenv("KVO_TEST_SEED")) {
    seed = static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  } else {
    seed = std::random_device{}();
  }
  std::printf("[ seed ] KVO_TEST_SEED=%u\n", seed);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace kvo::testing
