// FUZZ_CHECK(cond, fmt, ...): a failed property aborts the fuzzer with a message (libFuzzer keeps
// the input as a crash artifact).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#include <stdlib.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace kvo_fuzz {

// ARCHITECTURE.md §6: error messages never echo unbounded input. Whatever the input, a message a
// parser returns (or logs as a warning) stays under this many bytes.
inline constexpr size_t kMaxMessageBytes = 1024;

// Every message is bounded whatever the input (ARCHITECTURE.md §6); tests/fuzz/regressions/ holds
// the inputs that once broke the bound or the stack (10^5-deep JSON, long keys and values).
inline size_t MessageLimit() { return kMaxMessageBytes; }

// The first bytes of `s`, printable, for check messages.
inline std::string Preview(std::string_view s, size_t n = 200) {
  std::string out;
  for (unsigned char c : s.substr(0, n)) {
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  }
  if (s.size() > n) out += "...";
  return out;
}

// A scratch directory under /tmp for the whole fuzzing run ("/tmp/kvo-<name>-fuzz-XXXXXX"),
// removed at exit; aborts when none can be made. Call once, from LLVMFuzzerInitialize.
inline std::string g_scratch_root;
inline const std::string& MakeScratchRoot(const std::string& name) {
  std::string tmpl = "/tmp/kvo-" + name + "-fuzz-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  g_scratch_root = tmpl;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(g_scratch_root, ec);
  });
  return g_scratch_root;
}

}  // namespace kvo_fuzz

// A parser's error or warning message: not empty, bounded.
#define FUZZ_CHECK_MESSAGE(msg)                                                           \
  do {                                                                                    \
    const std::string& fuzz_msg_ = (msg);                                                 \
    FUZZ_CHECK(!fuzz_msg_.empty(), "an error without a message");                         \
    FUZZ_CHECK(fuzz_msg_.size() < kvo_fuzz::MessageLimit(), "a message of %zu bytes: %s", \
               fuzz_msg_.size(), kvo_fuzz::Preview(fuzz_msg_).c_str());                   \
  } while (0)
