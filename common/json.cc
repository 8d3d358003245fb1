// nlohmann_json adapter for every JSON reader: its exceptions stop in this file.
#include "common/json.h"

#include <utility>
#include <vector>

namespace kvo {
namespace {

std::string Prefixed(std::string_view what, const std::string& message) {
  if (what.empty()) return message;
  return std::string(what) + ": " + message;
}

template <typename Json>
Result<Json> Parse(std::string_view text, std::string_view what, const JsonLimits& limits) {
  Status st = CheckJsonLimits(text, limits);
  if (!st.ok()) return Status::InvalidArgument(Prefixed(what, st.message()));
  try {
    return Json::parse(text);
  } catch (const typename Json::exception& e) {
    // The parser's message quotes the last token read, which may be the whole (huge) input.
    return Status::InvalidArgument(Prefixed(what, "invalid JSON: " + CutForMessage(e.what(), 200)));
  }
}

// Small enough to print whole: at most kMaxNodes values, kMaxDepth levels, kMaxStringBytes of
// strings. Iterative, with an explicit stack bounded by kMaxNodes.
template <typename Json>
bool IsSmall(const Json& root) {
  constexpr size_t kMaxNodes = 16;
  constexpr size_t kMaxDepth = 3;
  constexpr size_t kMaxStringBytes = 64;
  std::vector<std::pair<const Json*, size_t>> stack{{&root, 0}};
  size_t nodes = 0;
  size_t string_bytes = 0;
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (++nodes > kMaxNodes || depth > kMaxDepth) return false;
    if (v->is_string()) {
      string_bytes += v->template get_ref<const typename Json::string_t&>().size();
      if (string_bytes > kMaxStringBytes) return false;
    } else if (v->is_structured()) {
      if (v->size() > kMaxNodes) return false;
      for (auto it = v->begin(); it != v->end(); ++it) {
        if (v->is_object()) string_bytes += it.key().size();
        stack.emplace_back(&*it, depth + 1);
      }
      if (string_bytes > kMaxStringBytes) return false;
    }
  }
  return true;
}

template <typename Json>
std::string Describe(const Json& v) {
  constexpr size_t kMax = 64;
  if (v.is_string()) {
    const auto& s = v.template get_ref<const typename Json::string_t&>();
    if (s.size() <= kMax) return v.dump(-1, ' ', false, Json::error_handler_t::replace);
    Json head = s.substr(0, kMax);
    std::string out = head.dump(-1, ' ', false, Json::error_handler_t::replace);
    out.pop_back();  // the closing quote: the string goes on
    return out + "... (a string of " + std::to_string(s.size()) + " bytes)";
  }
  if (!v.is_structured() || IsSmall(v)) {
    std::string out = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (out.size() > kMax) out = out.substr(0, kMax - 3) + "...";
    return out;
  }
  const size_t n = v.size();
  if (v.is_array()) {
    return "an array of " + std::to_string(n) + (n == 1 ? " element" : " elements");
  }
  return "an object of " + std::to_string(n) + (n == 1 ? " key" : " keys");
}

}  // namespace

Status CheckJsonLimits(std::string_view text, const JsonLimits& limits) {
  // Per open container: true for an array, and the commas seen at its level.
  std::vector<std::pair<bool, int64_t>> open;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (static_cast<int64_t>(open.size()) >= limits.max_depth) {
          return Status::InvalidArgument(
              "JSON nested deeper than " + std::to_string(limits.max_depth) + " levels (at byte " +
              std::to_string(i) + " of " + std::to_string(text.size()) + ")");
        }
        open.emplace_back(c == '[', 0);
        break;
      case ']':
      case '}':
        if (!open.empty()) open.pop_back();
        break;
      case ',':
        if (!open.empty() && open.back().first && limits.max_array_elements >= 0 &&
            ++open.back().second + 1 > limits.max_array_elements) {
          return Status::InvalidArgument("JSON array longer than " +
                                         std::to_string(limits.max_array_elements) +
                                         " elements (at byte " + std::to_string(i) + " of " +
                                         std::to_string(text.size()) + ")");
        }
        break;
      default:
        break;
    }
  }
  return Status::Ok();
}

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what,
                                 const JsonLimits& limits) {
  return Parse<nlohmann::json>(text, what, limits);
}

Result<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, std::string_view what,
                                                const JsonLimits& limits) {
  return Parse<nlohmann::ordered_json>(text, what, limits);
}

std::string DescribeJson(const nlohmann::json& v) { return Describe(v); }
std::string DescribeJson(const nlohmann::ordered_json& v) { return Describe(v); }

std::string CutForMessage(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return std::string(text.substr(0, max_bytes)) + "... (" + std::to_string(text.size()) + " bytes)";
}

}  // namespace kvo
