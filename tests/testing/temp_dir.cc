#include "tests/testing/temp_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

namespace kvo::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/kvo-test-XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
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
