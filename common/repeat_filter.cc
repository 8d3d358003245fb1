#include "common/repeat_filter.h"

namespace kvo {

std::string RepeatFilter::Decision::Describe() const {
  std::string out;
  if (run > 1) out = "; " + std::to_string(run) + " in a row";
  if (skipped > 0) {
    out += out.empty() ? "; " : ", ";
    out += std::to_string(skipped) + " not logged since the last such line";
  }
  return out;
}

RepeatFilter::Decision RepeatFilter::Note(std::string_view text) {
  if (run_ == 0 || text != text_) {
    text_.assign(text);
    run_ = 0;
  }
  ++run_;
  Decision d;
  d.run = run_;
  d.log = (run_ & (run_ - 1)) == 0;  // 1, 2, 4, 8, ...
  if (d.log) {
    d.skipped = skipped_;
    skipped_ = 0;
  } else {
    ++skipped_;
  }
  return d;
}

int64_t RepeatFilter::Reset() {
  int64_t n = run_;
  run_ = 0;
  skipped_ = 0;
  text_.clear();
  return n;
}

}  // namespace kvo
