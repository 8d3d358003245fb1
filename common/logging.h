// Logging shim over spdlog. Use KVO_LOG_INFO("fmt {}", x) etc.; the level is set once by main().
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace kvo {

// Installs kvo's logger (stderr) as spdlog's default, once. Call before starting threads that
// log: spdlog's registry is a lazy singleton inside an uninstrumented shared library, so its first
// use from two threads at once is invisible to ThreadSanitizer's view of the guard.
void InitLogging();

// Sets the global level from "trace|debug|info|warn|error|off"; unknown names keep "info".
// Calls InitLogging().
void SetLogLevel(std::string_view level);

}  // namespace kvo

#define KVO_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define KVO_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define KVO_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define KVO_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
