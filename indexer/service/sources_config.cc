// JSON adapter for the indexer config: nlohmann_json exceptions stop in this file.
#include "indexer/service/sources_config.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <set>

#include "common/json.h"
#include "events/kv_events_config.h"

namespace kvo {
namespace {

using nlohmann::json;

Status Bad(std::string_view origin, const std::string& what) {
  return Status::InvalidArgument(std::string(origin) + ": " + what);
}

Status WrongType(std::string_view origin, const std::string& key, const json& v,
                 const char* expected) {
  return Bad(origin,
             "'" + CutForMessage(key) + "' must be " + expected + ", got " + DescribeJson(v));
}

Status ReadInt(std::string_view origin, const std::string& key, const json& v, int64_t min,
               int64_t max, int64_t* out) {
  if (!v.is_number_integer()) return WrongType(origin, key, v, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return WrongType(origin, key, v, "an integer in range");
  }
  int64_t i = v.get<int64_t>();
  if (i < min || i > max) {
    return Bad(origin, "'" + CutForMessage(key) + "' must be in [" + std::to_string(min) + ", " +
                           std::to_string(max) + "], got " + std::to_string(i));
  }
  *out = i;
  return Status::Ok();
}

Status ReadString(std::string_view origin, const std::string& key, const json& v,
                  std::string* out) {
  if (!v.is_string()) return WrongType(origin, key, v, "a string");
  *out = v.get<std::string>();
  return Status::Ok();
}

Result<int64_t> ParseIntText(std::string_view key, std::string_view text, int64_t min,
                             int64_t max) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < min || v > max) {
    return Status::InvalidArgument("'" + CutForMessage(key) + "' must be an integer in [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                                   CutForMessage(text) + "'");
  }
  return v;
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > kMaxSourceName) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '@' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status ValidEndpoint(const std::string& source, const char* key, const std::string& ep) {
  return ValidateEndpoint(ep, "source '" + source + "': " + key);
}

constexpr int64_t kMaxRanks = 1024;
constexpr int64_t kMaxBlockSize = 1 << 20;

Result<HashParityConfig> ParseHashObject(std::string_view origin, const std::string& prefix,
                                         const json& v) {
  if (!v.is_object()) return WrongType(origin, prefix, v, "an object");
  HashParityConfig h;
  bool seed_given = false;
  for (const auto& [key, value] : v.items()) {
    std::string full = prefix + "." + key;
    if (key == "algo") {
      std::string name;
      KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &name));
      auto algo = ParseHashAlgo(name);
      if (!algo.ok())
        return Bad(origin, "'" + CutForMessage(full) + "': " + algo.status().message());
      h.algo = *algo;
    } else if (key == "seed") {
      seed_given = true;
      // PYTHONHASHSEED is a string; accept an integer for convenience.
      if (value.is_number_integer()) {
        h.seed = value.dump();
      } else {
        KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &h.seed));
      }
    } else if (key == "block_size") {
      KVO_RETURN_IF_ERROR(ReadInt(origin, full, value, 1, kMaxBlockSize, &h.block_size));
    } else {
      return Bad(origin,
                 "unknown key '" + CutForMessage(full) + "' (expected algo, seed, block_size)");
    }
  }
  if (!seed_given) {
    auto seed = ResolveNoneHashSeed(h.algo, std::nullopt);
    if (!seed.ok())
      return Bad(origin, "'" + CutForMessage(prefix) + ".seed': " + seed.status().message());
    h.seed = *seed;
  }
  return h;
}

Result<SourceConfig> ParseSourceObject(std::string_view origin, size_t index, const json& v) {
  std::string prefix = "sources[" + std::to_string(index) + "]";
  if (!v.is_object()) return WrongType(origin, prefix, v, "an object");
  SourceConfig s;
  bool has_endpoint = false;
  for (const auto& [key, value] : v.items()) {
    std::string full = prefix + "." + key;
    if (key == "name") {
      KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &s.name));
    } else if (key == "endpoint") {
      KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &s.endpoint));
      has_endpoint = true;
    } else if (key == "replay_endpoint") {
      if (value.is_null()) continue;
      std::string ep;
      KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &ep));
      s.replay_endpoint = ep;
    } else if (key == "topic") {
      KVO_RETURN_IF_ERROR(ReadString(origin, full, value, &s.topic));
    } else if (key == "dp_ranks") {
      KVO_RETURN_IF_ERROR(ReadInt(origin, full, value, 1, kMaxRanks, &s.dp_ranks));
    } else if (key == "dp_rank_start") {
      KVO_RETURN_IF_ERROR(ReadInt(origin, full, value, 0, kMaxRanks, &s.dp_rank_start));
    } else if (key == "bind") {
      if (!value.is_boolean()) return WrongType(origin, full, value, "true or false");
      s.bind = value.get<bool>();
    } else if (key == "hash") {
      if (value.is_null()) continue;
      KVO_ASSIGN_OR_RETURN(HashParityConfig h, ParseHashObject(origin, full, value));
      s.hash = h;
    } else {
      return Bad(origin, "unknown key '" + CutForMessage(full) +
                             "' (expected name, endpoint, replay_endpoint, topic, dp_ranks, "
                             "dp_rank_start, bind, hash)");
    }
  }
  if (s.name.empty()) return Bad(origin, "'" + prefix + ".name' is required");
  if (!has_endpoint) return Bad(origin, "'" + prefix + ".endpoint' is required");
  Status st = ValidateSource(s);
  if (!st.ok()) return Bad(origin, st.message());
  return s;
}

// "http://HOST:PORT[/]" -> the target with its defaults.
Result<DiscoverTarget> ParseDiscoverUrl(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("discover URL '" + CutForMessage(url) + "': " + why +
                                   " (expected http://HOST:PORT of a vLLM API server)");
  };
  if (!url.starts_with("http://")) return bad("only http:// is supported");
  std::string_view hp = url.substr(7);
  if (hp.ends_with("/")) hp.remove_suffix(1);
  if (hp.find('/') != std::string_view::npos) return bad("give no path");
  auto addr = ParseHttpAddress(hp);
  if (!addr.ok()) return bad(addr.status().message());
  if (addr->port == 0) return bad("port 0 cannot be dialled");
  DiscoverTarget t;
  t.url = "http://" + std::string(hp);
  t.address = *addr;
  t.instance_id = addr->host + ":" + std::to_string(addr->port);
  if (!ValidSourceIdentity(t.instance_id)) {
    return bad("its HOST:PORT is no valid instance_id; give instance_id=");
  }
  return t;
}

// One key of a discover target (flag or object); `what` names it in errors.
Status SetDiscoverKey(DiscoverTarget* t, const std::string& key, const std::string& value) {
  auto need_id = [&](std::string* out) {
    if (!ValidSourceIdentity(value)) {
      return Status::InvalidArgument("'" + key +
                                     "' must be 1-100 characters of [A-Za-z0-9_.:-], got '" +
                                     CutForMessage(value) + "'");
    }
    *out = value;
    return Status::Ok();
  };
  if (key == "instance_id") return need_id(&t->instance_id);
  if (key == "tenant_id") return need_id(&t->tenant_id);
  if (key == "model") {
    if (value.empty() || value.size() > 4096) {
      return Status::InvalidArgument("'model' must be 1-4096 bytes");
    }
    t->model = value;
    return Status::Ok();
  }
  if (key == "lora_name") {
    t->lora_name = value;
    return Status::Ok();
  }
  if (key == "additionalsalt") {
    t->additional_salt = value;
    return Status::Ok();
  }
  if (key == "block_size") {
    KVO_ASSIGN_OR_RETURN(t->block_size, ParseIntText(key, value, 1, kMaxBlockSize));
    return Status::Ok();
  }
  return Status::InvalidArgument("unknown key '" + CutForMessage(key) +
                                 "' (expected instance_id, tenant_id, model, lora_name, "
                                 "block_size, additionalsalt)");
}

Result<DiscoverTarget> ParseDiscoverObject(std::string_view origin, size_t index, const json& v) {
  std::string prefix = "discover[" + std::to_string(index) + "]";
  if (v.is_string()) {
    auto t = ParseDiscoverFlag(v.get<std::string>());
    if (!t.ok()) return Bad(origin, "'" + prefix + "': " + t.status().message());
    return t;
  }
  if (!v.is_object()) return WrongType(origin, prefix, v, "a URL string or an object");
  const json* url = nullptr;
  auto it = v.find("url");
  if (it != v.end()) url = &*it;
  if (url == nullptr) return Bad(origin, "'" + prefix + ".url' is required");
  if (!url->is_string()) return WrongType(origin, prefix + ".url", *url, "a string");
  auto t = ParseDiscoverUrl(url->get<std::string>());
  if (!t.ok()) return Bad(origin, "'" + prefix + ".url': " + t.status().message());
  for (const auto& [key, value] : v.items()) {
    if (key == "url") continue;
    std::string text;
    if (key == "block_size" && value.is_number_integer()) {
      text = value.dump();
    } else {
      KVO_RETURN_IF_ERROR(ReadString(origin, prefix + "." + key, value, &text));
    }
    Status st = SetDiscoverKey(&*t, key, text);
    if (!st.ok()) return Bad(origin, "'" + prefix + "': " + st.message());
  }
  return t;
}

}  // namespace

Result<DiscoverTarget> ParseDiscoverFlag(std::string_view flag) {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("--discover '" + CutForMessage(flag) + "': " + what);
  };
  size_t comma = flag.find(',');
  auto t = ParseDiscoverUrl(flag.substr(0, comma));
  if (!t.ok()) return bad(t.status().message());
  while (comma != std::string_view::npos) {
    size_t start = comma + 1;
    comma = flag.find(',', start);
    std::string_view item = flag.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t keq = item.find('=');
    if (keq == std::string_view::npos) {
      return bad("expected key=value, got '" + CutForMessage(item) + "'");
    }
    Status st =
        SetDiscoverKey(&*t, std::string(item.substr(0, keq)), std::string(item.substr(keq + 1)));
    if (!st.ok()) return bad(st.message());
  }
  return t;
}

Status ValidateDiscoverTargets(const std::vector<DiscoverTarget>& targets) {
  std::set<std::string> urls;
  std::set<std::string> ids;
  for (const DiscoverTarget& t : targets) {
    if (!urls.insert(t.url).second) {
      return Status::InvalidArgument("discover URL '" + t.url + "' is given twice");
    }
    if (!ids.insert(t.instance_id + "|" + t.tenant_id).second) {
      return Status::InvalidArgument("discover URL '" + t.url + "': instance_id '" + t.instance_id +
                                     "' (tenant '" + t.tenant_id +
                                     "') is used by another discover target; give instance_id=");
    }
  }
  return Status::Ok();
}

Status ValidateSource(const SourceConfig& s) {
  if (!ValidName(s.name)) {
    return Status::InvalidArgument("source name '" + CutForMessage(s.name) +
                                   "' must be 1-128 characters of [A-Za-z0-9_.:@-]");
  }
  KVO_RETURN_IF_ERROR(ValidEndpoint(s.name, "endpoint", s.endpoint));
  if (s.replay_endpoint) {
    KVO_RETURN_IF_ERROR(ValidEndpoint(s.name, "replay_endpoint", *s.replay_endpoint));
  }
  if (s.dp_ranks < 1 || s.dp_ranks > kMaxRanks) {
    return Status::InvalidArgument("source '" + CutForMessage(s.name) +
                                   "': dp_ranks must be in [1, " + std::to_string(kMaxRanks) +
                                   "], got " + std::to_string(s.dp_ranks));
  }
  if (s.dp_rank_start < 0 || s.dp_rank_start > kMaxRanks) {
    return Status::InvalidArgument("source '" + CutForMessage(s.name) +
                                   "': dp_rank_start must be in [0, " + std::to_string(kMaxRanks) +
                                   "], got " + std::to_string(s.dp_rank_start));
  }
  if (s.hash && (s.hash->block_size < 1 || s.hash->block_size > kMaxBlockSize)) {
    return Status::InvalidArgument("source '" + CutForMessage(s.name) +
                                   "': block_size must be in [1, " + std::to_string(kMaxBlockSize) +
                                   "], got " + std::to_string(s.hash->block_size));
  }
  auto streams = ExpandStreams(s);
  return streams.ok() ? Status::Ok() : streams.status();
}

Status ValidateSources(const std::vector<SourceConfig>& sources) {
  std::set<std::string> names;
  std::set<std::string> endpoints;
  for (const SourceConfig& s : sources) {
    KVO_RETURN_IF_ERROR(ValidateSource(s));
    if (!names.insert(s.name).second) {
      return Status::InvalidArgument("source name '" + CutForMessage(s.name) + "' is used twice");
    }
    KVO_ASSIGN_OR_RETURN(std::vector<SourceStream> streams, ExpandStreams(s));
    for (const SourceStream& st : streams) {
      if (!endpoints.insert(st.endpoint).second) {
        return Status::InvalidArgument("source '" + CutForMessage(s.name) + "' rank " +
                                       std::to_string(st.dp_rank) + ": endpoint '" + st.endpoint +
                                       "' is already used by another source or rank");
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<SourceStream>> ExpandStreams(const SourceConfig& s) {
  std::vector<SourceStream> out;
  for (int64_t i = 0; i < s.dp_ranks; ++i) {
    int64_t rank = s.dp_rank_start + i;
    SourceStream st;
    st.source = s.name;
    st.dp_rank = rank;
    auto ep = OffsetEndpointPort(s.endpoint, rank);
    if (!ep.ok()) return ep.status().WithContext("source '" + CutForMessage(s.name) + "'");
    st.endpoint = *ep;
    if (s.replay_endpoint) {
      auto rep = OffsetEndpointPort(*s.replay_endpoint, rank);
      if (!rep.ok())
        return rep.status().WithContext("source '" + CutForMessage(s.name) + "' replay_endpoint");
      st.replay_endpoint = *rep;
    }
    out.push_back(std::move(st));
  }
  return out;
}

Result<IndexerConfig> ParseIndexerConfig(std::string_view text, std::string_view origin) {
  KVO_ASSIGN_OR_RETURN(json doc, ParseJson(text, origin));
  if (!doc.is_object()) return Bad(origin, "expected a JSON object, got " + DescribeJson(doc));
  IndexerConfig c;
  bool has_sources = false;
  bool has_discover = false;
  try {
    for (const auto& [key, v] : doc.items()) {
      if (key == "db") {
        KVO_RETURN_IF_ERROR(ReadString(origin, key, v, &c.db));
      } else if (key == "http") {
        KVO_RETURN_IF_ERROR(ReadString(origin, key, v, &c.http));
        auto addr = ParseHttpAddress(c.http);
        if (!addr.ok()) return Bad(origin, "'http': " + addr.status().message());
      } else if (key == "max_query_tokens") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, int64_t{1} << 30, &c.max_query_tokens));
      } else if (key == "max_sources") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 1'000'000, &c.max_sources));
      } else if (key == "default_block_size") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, kMaxBlockSize, &c.default_block_size));
      } else if (key == "replay_timeout_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 600'000, &c.replay_timeout_ms));
      } else if (key == "idle_probe_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 0, 3'600'000, &c.idle_probe_ms));
      } else if (key == "hwm") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 0, int64_t{1} << 31, &c.hwm));
      } else if (key == "retry_initial_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 600'000, &c.retry_initial_ms));
      } else if (key == "retry_max_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 3'600'000, &c.retry_max_ms));
      } else if (key == "silent_after_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 86'400'000, &c.silent_after_ms));
      } else if (key == "discover_interval_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 10, 3'600'000, &c.discover_interval_ms));
      } else if (key == "discover_retry_initial_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 600'000, &c.discover_retry_initial_ms));
      } else if (key == "discover_retry_max_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 3'600'000, &c.discover_retry_max_ms));
      } else if (key == "discover_timeout_ms") {
        KVO_RETURN_IF_ERROR(ReadInt(origin, key, v, 1, 600'000, &c.discover_timeout_ms));
      } else if (key == "discover") {
        if (!v.is_array()) return WrongType(origin, key, v, "an array");
        has_discover = true;
        for (size_t i = 0; i < v.size(); ++i) {
          KVO_ASSIGN_OR_RETURN(DiscoverTarget t, ParseDiscoverObject(origin, i, v[i]));
          c.discover.push_back(std::move(t));
        }
      } else if (key == "sources") {
        if (!v.is_array()) return WrongType(origin, key, v, "an array");
        has_sources = true;
        for (size_t i = 0; i < v.size(); ++i) {
          KVO_ASSIGN_OR_RETURN(SourceConfig s, ParseSourceObject(origin, i, v[i]));
          c.sources.push_back(std::move(s));
        }
      } else {
        return Bad(origin, "unknown key '" + CutForMessage(key) + "'");
      }
    }
  } catch (const json::exception& e) {
    return Bad(origin, e.what());
  }
  if (!has_sources && !has_discover) return Bad(origin, "'sources' or 'discover' is required");
  if (c.retry_max_ms < c.retry_initial_ms) {
    return Bad(origin, "'retry_max_ms' must be >= 'retry_initial_ms'");
  }
  if (c.discover_retry_max_ms < c.discover_retry_initial_ms) {
    return Bad(origin, "'discover_retry_max_ms' must be >= 'discover_retry_initial_ms'");
  }
  Status dst = ValidateDiscoverTargets(c.discover);
  if (!dst.ok()) return Bad(origin, dst.message());
  Status st = ValidateSources(c.sources);
  if (!st.ok()) return Bad(origin, st.message());
  return c;
}

Result<SourceConfig> ParseSourceFlag(std::string_view flag) {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("--source '" + CutForMessage(flag) + "': " + what);
  };
  size_t eq = flag.find('=');
  if (eq == std::string_view::npos || eq == 0) return bad("expected NAME=ENDPOINT[,key=value...]");
  SourceConfig s;
  s.name = std::string(flag.substr(0, eq));
  std::string_view rest = flag.substr(eq + 1);
  size_t comma = rest.find(',');
  s.endpoint = std::string(rest.substr(0, comma));
  std::optional<HashParityConfig> hash;
  bool seed_given = false;
  while (comma != std::string_view::npos) {
    rest = rest.substr(comma + 1);
    comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t keq = item.find('=');
    if (keq == std::string_view::npos)
      return bad("expected key=value, got '" + CutForMessage(item) + "'");
    std::string key(item.substr(0, keq));
    std::string_view value = item.substr(keq + 1);
    if (key == "replay") {
      s.replay_endpoint = std::string(value);
    } else if (key == "topic") {
      s.topic = std::string(value);
    } else if (key == "dp_ranks") {
      auto v = ParseIntText(key, value, 1, kMaxRanks);
      if (!v.ok()) return bad(v.status().message());
      s.dp_ranks = *v;
    } else if (key == "dp_rank_start") {
      auto v = ParseIntText(key, value, 0, kMaxRanks);
      if (!v.ok()) return bad(v.status().message());
      s.dp_rank_start = *v;
    } else if (key == "bind") {
      if (value != "true" && value != "false") return bad("'bind' must be true or false");
      s.bind = value == "true";
    } else if (key == "hash_algo") {
      auto algo = ParseHashAlgo(value);
      if (!algo.ok()) return bad(algo.status().message());
      if (!hash) hash.emplace();
      hash->algo = *algo;
    } else if (key == "hash_seed") {
      if (!hash) hash.emplace();
      hash->seed = std::string(value);
      seed_given = true;
    } else if (key == "block_size") {
      auto v = ParseIntText(key, value, 1, kMaxBlockSize);
      if (!v.ok()) return bad(v.status().message());
      if (!hash) hash.emplace();
      hash->block_size = *v;
    } else {
      return bad("unknown key '" + CutForMessage(key) +
                 "' (expected replay, topic, dp_ranks, dp_rank_start, bind, hash_algo, hash_seed, "
                 "block_size)");
    }
  }
  if (hash && !seed_given) {
    auto seed = ResolveNoneHashSeed(hash->algo, std::nullopt);
    if (!seed.ok()) return bad("hash_seed: " + seed.status().message());
    hash->seed = *seed;
  }
  s.hash = hash;
  Status st = ValidateSource(s);
  if (!st.ok()) return bad(st.message());
  return s;
}

Result<HttpAddress> ParseHttpAddress(std::string_view text) {
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("HTTP address '" + CutForMessage(text) + "': " + why +
                                   " (expected HOST:PORT, e.g. 127.0.0.1:8080)");
  };
  HttpAddress a;
  std::string_view port_text;
  if (text.starts_with("[")) {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("bad IPv6 form");
    }
    a.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    a.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (a.host.empty()) return bad("no host");
  int port = -1;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return bad("port must be 0-65535");
  }
  a.port = port;
  return a;
}

bool IsLoopbackHost(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

bool ValidSourceIdentity(std::string_view v) {
  if (v.empty() || v.size() > 100) return false;
  for (char c : v) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace kvo
