// Golden vectors under schemas/golden/ (found through $KVO_SOURCE_ROOT, set by ctest).
#pragma once

#include <string>

namespace kvo::testing {

// The bytes of schemas/golden/<name>.msgpack; records a test failure when the file is missing.
std::string ReadGolden(const std::string& name);

}  // namespace kvo::testing
