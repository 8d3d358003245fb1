// LogCapture: the lines kvo's logger writes while it lives ("warning <message>"), for tests that
// assert what an operator would read. Adds a ring-buffer sink to the default logger and removes
// it on destruction; create and destroy it while no other thread logs (before a service starts,
// after it stopped): spdlog's sink list itself is not locked.
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/logging.h"

namespace kvo::testing {

class LogCapture {
 public:
  explicit LogCapture(size_t capacity = 4096)
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(capacity)) {
    InitLogging();
    sink_->set_pattern("%l %v");
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    std::erase(sinks, sink_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> Lines() { return sink_->last_formatted(); }

  // The lines that contain every one of `parts`.
  std::vector<std::string> Matching(std::initializer_list<std::string_view> parts) {
    std::vector<std::string> out;
    for (std::string& line : Lines()) {
      bool all = true;
      for (std::string_view p : parts) all = all && line.find(p) != std::string::npos;
      if (all) out.push_back(std::move(line));
    }
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace kvo::testing
