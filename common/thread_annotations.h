// Clang thread-safety annotations (no-ops on other compilers).
#pragma once

#if defined(__clang__)
#define KVO_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVO_THREAD_ANNOTATION_(x)
#endif

#define GUARDED_BY(x) KVO_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) KVO_THREAD_ANNOTATION_(pt_guarded_by(x))
#define EXCLUSIVE_LOCKS_REQUIRED(...) KVO_THREAD_ANNOTATION_(exclusive_locks_required(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) KVO_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define CAPABILITY(x) KVO_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY KVO_THREAD_ANNOTATION_(scoped_lockable)
#define ACQUIRE(...) KVO_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVO_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS KVO_THREAD_ANNOTATION_(no_thread_safety_analysis)
