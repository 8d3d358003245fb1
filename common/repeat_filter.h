// RepeatFilter: which occurrences of a repeating warning reach the log. A condition retried with
// backoff for hours (a source that cannot subscribe, a discovery target that is down) would
// otherwise write a line per attempt per stream; with many streams that floods stderr, and a slow
// stderr reader then blocks every thread that logs (spdlog's console sink holds one mutex).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvo {

// Logs an occurrence when its text differs from the previous one, and otherwise the 1st, 2nd,
// 4th, 8th, ... of a run of identical texts: a run of n identical occurrences logs
// floor(log2 n) + 1 lines. Each logged decision carries how many were left out since the last
// logged one, so the line can say so. Not thread-safe: one filter per thread (per stream).
class RepeatFilter {
 public:
  struct Decision {
    bool log = false;
    int64_t run = 0;      // this occurrence's position in its run of identical texts, from 1
    int64_t skipped = 0;  // when log: occurrences left out since the last logged one

    // "" for a first occurrence with nothing left out; otherwise a suffix for the logged line,
    // "; 8 in a row, 3 not logged since the last such line".
    std::string Describe() const;
  };

  Decision Note(std::string_view text);

  // Ends the run (the condition cleared); returns its length, 0 when there was none.
  int64_t Reset();

 private:
  std::string text_;
  int64_t run_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace kvo
