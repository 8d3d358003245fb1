// Which sanitizer this test build runs under, for gcc (__SANITIZE_*__) and clang
// (__has_feature), so a test can relax what a sanitizer makes impossible and say why.
#pragma once

#if defined(__has_feature)
#define KVO_TESTING_HAS_FEATURE(x) __has_feature(x)
#else
#define KVO_TESTING_HAS_FEATURE(x) 0
#endif

namespace kvo::testing {

#if defined(__SANITIZE_ADDRESS__) || KVO_TESTING_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__) || KVO_TESTING_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace kvo::testing
