// JSON adapter for --kv-events-config: the only file here that calls nlohmann_json for configs.
#include "events/kv_events_config.h"

#include <nlohmann/json.hpp>

#include <charconv>

#include "common/hex.h"
#include "common/json.h"
#include "common/logging.h"
#include "events/journal.h"

namespace kvo {
namespace {

using nlohmann::json;

std::string Show(const json& v) { return DescribeJson(v); }

Status WrongType(const std::string& key, const json& v, const char* expected) {
  return Status::InvalidArgument("--kv-events-config: '" + key + "' must be " + expected +
                                 ", got " + Show(v));
}

Status ReadInt(const std::string& key, const json& v, int64_t* out) {
  if (!v.is_number_integer()) return WrongType(key, v, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return WrongType(key, v, "an integer in int64 range");
  }
  int64_t i = v.get<int64_t>();
  if (i < 0) return WrongType(key, v, "a non-negative integer");
  *out = i;
  return Status::Ok();
}

Status ReadString(const std::string& key, const json& v, std::string* out) {
  if (!v.is_string()) return WrongType(key, v, "a string");
  *out = v.get<std::string>();
  return Status::Ok();
}

}  // namespace

Result<KvEventsConfig> ParseKvEventsConfig(std::string_view text) {
  KVO_ASSIGN_OR_RETURN(json doc, ParseJson(text, "--kv-events-config"));
  if (!doc.is_object()) {
    return Status::InvalidArgument("--kv-events-config: expected a JSON object, got " + Show(doc));
  }
  KvEventsConfig c;
  bool publisher_set = false;
  for (const auto& [key, v] : doc.items()) {
    if (key == "enable_kv_cache_events") {
      if (!v.is_boolean()) return WrongType(key, v, "true or false");
      c.enable_kv_cache_events = v.get<bool>();
    } else if (key == "publisher") {
      if (v.is_null()) continue;
      if (!v.is_string() || (v.get<std::string>() != "null" && v.get<std::string>() != "zmq")) {
        return Status::InvalidArgument(
            "--kv-events-config: 'publisher': Input should be 'null' or 'zmq', got " + Show(v));
      }
      c.publisher = v.get<std::string>();
      publisher_set = true;
    } else if (key == "endpoint") {
      KVO_RETURN_IF_ERROR(ReadString(key, v, &c.endpoint));
    } else if (key == "replay_endpoint") {
      if (v.is_null()) {
        c.replay_endpoint.reset();
      } else {
        std::string s;
        KVO_RETURN_IF_ERROR(ReadString(key, v, &s));
        c.replay_endpoint = std::move(s);
      }
    } else if (key == "buffer_steps") {
      KVO_RETURN_IF_ERROR(ReadInt(key, v, &c.buffer_steps));
    } else if (key == "hwm") {
      KVO_RETURN_IF_ERROR(ReadInt(key, v, &c.hwm));
    } else if (key == "max_queue_size") {
      KVO_RETURN_IF_ERROR(ReadInt(key, v, &c.max_queue_size));
    } else if (key == "topic") {
      KVO_RETURN_IF_ERROR(ReadString(key, v, &c.topic));
    } else if (key == "journal_dir") {
      if (v.is_null()) continue;
      std::string s;
      KVO_RETURN_IF_ERROR(ReadString(key, v, &s));
      if (s.empty()) return WrongType(key, v, "a non-empty directory path");
      c.journal_dir = std::move(s);
    } else if (key == "journal_fsync") {
      KVO_RETURN_IF_ERROR(ReadString(key, v, &c.journal_fsync));
      auto policy = ParseFsyncPolicy(c.journal_fsync);
      if (!policy.ok()) return policy.status().WithContext("--kv-events-config: 'journal_fsync'");
    } else if (key == "encoding") {
      KVO_RETURN_IF_ERROR(ReadString(key, v, &c.encoding));
      if (c.encoding != "map" && c.encoding != "array") {
        return WrongType(key, v, "\"map\" or \"array\"");
      }
    } else {
      return Status::InvalidArgument("--kv-events-config: unknown key '" + CutForMessage(key) +
                                     "' (value " + Show(v) + ")");
    }
  }
  if (!publisher_set) {
    c.publisher = c.enable_kv_cache_events ? "zmq" : "null";
  } else if (c.publisher != "null" && !c.enable_kv_cache_events) {
    KVO_LOG_WARN(
        "--kv-events-config: publisher '{}' is set but enable_kv_cache_events is false; "
        "no events will be published",
        c.publisher);
  }
  if (c.enable_kv_cache_events && c.publisher == "zmq") {
    KVO_RETURN_IF_ERROR(ValidateEndpoint(c.endpoint, "--kv-events-config: 'endpoint'"));
  }
  if (c.replay_endpoint) {
    KVO_RETURN_IF_ERROR(
        ValidateEndpoint(*c.replay_endpoint, "--kv-events-config: 'replay_endpoint'"));
  }
  return c;
}

namespace {

// At most 80 characters of `s`, non-printable bytes as \xNN.
std::string ShowBounded(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      AppendHex(std::string_view(&s[i], 1), &out);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (out.size() >= 80 || s.size() > 80) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace

Status ValidateEndpoint(std::string_view ep, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(what) + " '" + ShowBounded(ep) +
                                   "': " + std::string(why));
  };
  if (ep.size() > 1024) return bad("longer than 1024 bytes");
  for (char ch : ep) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
      return bad("contains a control character");
    }
  }
  constexpr std::string_view kUsage = "must be tcp://HOST:PORT, ipc://PATH or inproc://NAME";
  if (ep.starts_with("ipc://") || ep.starts_with("inproc://")) {
    if (ep.substr(ep.find("://") + 3).empty()) return bad(kUsage);
    return Status::Ok();
  }
  if (!ep.starts_with("tcp://")) return bad(kUsage);
  std::string_view rest = ep.substr(6);
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad(kUsage);
  std::string_view host = rest.substr(0, colon);
  std::string_view port = rest.substr(colon + 1);
  if (host.front() == '[' && host.back() != ']') return bad("unclosed '[' in the host");
  if (port == "*") return Status::Ok();
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string_view::npos) {
    return bad("the port must be a number in 1-65535 or '*'");
  }
  int value = std::stoi(std::string(port));
  if (value < 1 || value > 65535) return bad("the port must be a number in 1-65535 or '*'");
  return Status::Ok();
}

Result<std::string> OffsetEndpointPort(std::string_view endpoint, int64_t rank) {
  if (endpoint.empty() || rank == 0) return std::string(endpoint);
  if (endpoint.find("inproc") != std::string_view::npos) {
    return std::string(endpoint) + "_dp" + std::to_string(rank);
  }
  if (endpoint.find("tcp") != std::string_view::npos) {
    size_t colon = endpoint.rfind(':');
    if (colon == std::string_view::npos) return std::string(endpoint);
    std::string_view port_text = endpoint.substr(colon + 1);
    int64_t port = 0;
    auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || ptr != port_text.data() + port_text.size()) {
      return Status::InvalidArgument("endpoint '" + ShowBounded(endpoint) + "': port '" +
                                     ShowBounded(port_text) + "' is not a number");
    }
    if (rank < 0 || rank > 65535 || port < 0 || port > 65535 - rank) {
      return Status::InvalidArgument("endpoint '" + ShowBounded(endpoint) + "': port " +
                                     std::to_string(port) + " + data parallel rank " +
                                     std::to_string(rank) + " exceeds 65535");
    }
    return std::string(endpoint.substr(0, colon)) + ":" + std::to_string(port + rank);
  }
  return Status::InvalidArgument("Invalid endpoint: must contain 'inproc' or 'tcp' (endpoint '" +
                                 std::string(endpoint) + "', data parallel rank " +
                                 std::to_string(rank) + ")");
}

bool ShouldBind(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos || endpoint.starts_with("ipc://") ||
         endpoint.starts_with("inproc://");
}

bool BindsBeyondLoopback(std::string_view endpoint) {
  if (!endpoint.starts_with("tcp://")) return false;
  std::string_view host = endpoint.substr(6, endpoint.rfind(':') - 6);
  return !(host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" ||
           host.starts_with("127."));
}

}  // namespace kvo
