#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace kvo {

void InitLogging() {
  // Logs go to stderr so that stdout stays machine-readable (JSON lines).
  static const bool installed = [] {
    auto logger = spdlog::stderr_color_mt("kvo");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)installed;
}

void SetLogLevel(std::string_view level) {
  InitLogging();
  spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
}

}  // namespace kvo
