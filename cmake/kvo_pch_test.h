// The test executables' shared precompiled header (cmake/KvoPch.cmake kvo_test_pch).
#include <gtest/gtest.h>

#include "kvo_pch.h"
