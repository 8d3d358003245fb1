// The process's open-file limit (RLIMIT_NOFILE). A service that holds a socket or two per source
// (`kvo index serve`: a ZeroMQ SUB socket, its mailbox and connection, a replay DEALER) runs out of
// descriptors at Debian's default soft limit of 1024 with a few hundred sources, while the hard
// limit is usually far higher: RaiseFdLimit lifts the soft limit to the hard one at start, and
// FdLimitNote names the limit in the error a caller reports when a descriptor is refused (EMFILE).
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"

namespace kvo {

struct FdLimit {
  uint64_t soft = 0;  // RLIM_INFINITY is reported as UINT64_MAX
  uint64_t hard = 0;
};

// The current limits. IOError naming errno when getrlimit fails.
Result<FdLimit> CurrentFdLimit();

// Raises the soft limit to the hard limit (nothing when already equal) and returns the limits
// in force afterwards. IOError naming both limits when setrlimit refuses.
Result<FdLimit> RaiseFdLimit();

// "the process's open-file limit (RLIMIT_NOFILE) is 64 (hard 64): ..." — appended to an EMFILE
// error so that the operator knows which limit was reached and how to raise it.
std::string FdLimitNote();

}  // namespace kvo
