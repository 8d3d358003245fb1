// KVO_CHECK: a broken invariant is a bug; log and abort. KVO_DCHECK only in debug builds.
#pragma once

#include <cstdio>
#include <cstdlib>

#define KVO_CHECK(cond)                                                                 \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: KVO_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#ifdef NDEBUG
#define KVO_DCHECK(cond) \
  do {                   \
  } while (false && (cond))
#else
#define KVO_DCHECK(cond) KVO_CHECK(cond)
#endif
