// JSON input that a hostile document cannot turn into a crash: every JSON reader of kvo parses
// through ParseJson (a nesting-depth limit checked on the text before any value is built, an
// optional cap on array lengths, nlohmann's exceptions stopped here), and error messages describe
// a value with DescribeJson (bounded space, no recursion) instead of dump(), which recurses once
// per nesting level and echoes the whole value.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"
#include "common/status.h"

namespace kvo {

// Deeper than any document kvo reads (configs, queries, traces nest at most 4 levels).
inline constexpr int kJsonMaxDepth = 64;

struct JsonLimits {
  int max_depth = kJsonMaxDepth;    // arrays/objects nested deeper than this: refused
  int64_t max_array_elements = -1;  // < 0: no limit; else a longer array anywhere is refused
};

// Scans `text` once, without recursion and in O(max_depth) memory, and refuses it when it nests
// deeper than `limits.max_depth` or holds an array longer than `limits.max_array_elements`
// (InvalidArgument naming the limit and the byte offset). Says nothing about syntax.
Status CheckJsonLimits(std::string_view text, const JsonLimits& limits = {});

// CheckJsonLimits, then nlohmann's parser. InvalidArgument "invalid JSON: ..." (the parser's
// message cut to a bounded length) or the limit that was exceeded. `what` prefixes the message
// (e.g. "--kv-events-config"); empty: no prefix.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what = {},
                                 const JsonLimits& limits = {});
Result<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, std::string_view what = {},
                                                const JsonLimits& limits = {});

// A short description of `v` for an error message, at most ~80 bytes whatever `v` is, computed
// without recursion: scalars as JSON (strings cut to a prefix, with their length), a small shallow
// array/object as its JSON cut to 64 bytes, anything else as "an array of N elements" / "an
// object of N keys".
std::string DescribeJson(const nlohmann::json& v);
std::string DescribeJson(const nlohmann::ordered_json& v);

// `text` itself when at most `max_bytes` long, else its first bytes, "...", and the full length
// ("abc... (200000 bytes)"). For messages that would otherwise echo unbounded input.
std::string CutForMessage(std::string_view text, size_t max_bytes = 64);

}  // namespace kvo
