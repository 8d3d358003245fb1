#include "tests/testing/golden.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kvo::testing {

std::string ReadGolden(const std::string& name) {
  const char* root = std::getenv("KVO_SOURCE_ROOT");
  std::string path = std::string(root ? root : ".") + "/schemas/golden/" + name + ".msgpack";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden vector " << path << " (set KVO_SOURCE_ROOT)";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvo::testing
