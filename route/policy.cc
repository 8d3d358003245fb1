// The router's pure functions (route.h). nlohmann_json exceptions stop in this file.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/json.h"
#include "route/route.h"

namespace kvo::route {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Result<Policy> ParsePolicy(std::string_view text) {
  if (text == "kv") return Policy::kKv;
  if (text == "round-robin") return Policy::kRoundRobin;
  if (text == "random") return Policy::kRandom;
  if (text == "least-loaded") return Policy::kLeastLoaded;
  return Bad("--policy: unknown policy '" + CutForMessage(text) +
             "' (expected kv, round-robin, random or least-loaded)");
}

std::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kKv:
      return "kv";
    case Policy::kRoundRobin:
      return "round-robin";
    case Policy::kRandom:
      return "random";
    case Policy::kLeastLoaded:
      return "least-loaded";
  }
  return "?";
}

Result<TierWeights> ParseTierWeights(std::string_view text) {
  TierWeights w;
  if (Trim(text).empty())
    return Bad("--tier-weights: empty (expected e.g. GPU=1,CPU=0.8,DISK=0.5)");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    pos = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Bad("--tier-weights: '" + CutForMessage(item) + "' is not MEDIUM=WEIGHT");
    }
    std::string medium = Upper(Trim(item.substr(0, eq)));
    std::string value = Trim(item.substr(eq + 1));
    double v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty() ||
        !std::isfinite(v) || v < 0) {
      return Bad("--tier-weights: the weight of " + CutForMessage(medium) +
                 " must be a finite number >= 0, got '" + CutForMessage(value) + "'");
    }
    if (medium == "GPU") {
      w.gpu = v;
    } else if (medium == "CPU") {
      w.cpu = v;
    } else if (medium == "DISK" || medium == "STORAGE") {
      w.disk = v;
    } else {
      return Bad("--tier-weights: unknown medium '" + CutForMessage(medium) +
                 "' (expected GPU, CPU or DISK)");
    }
  }
  return w;
}

int64_t PrefixMatch::GpuTokens() const { return std::max<int64_t>(gpu, 0); }
int64_t PrefixMatch::CpuTokens() const {
  return std::max<int64_t>(std::max(cpu, gpu) - GpuTokens(), 0);
}
int64_t PrefixMatch::DiskTokens() const {
  return std::max<int64_t>(std::max({disk, cpu, gpu}) - std::max<int64_t>(std::max(cpu, gpu), 0),
                           0);
}
int64_t PrefixMatch::PrefixTokens() const {
  return std::max<int64_t>({longest, gpu, cpu, disk, 0});
}

Result<std::map<std::string, PrefixMatch>> ParseQueryResponse(std::string_view body,
                                                              std::string_view tenant) {
  auto parsed = ParseJson(body, "indexer /query response");
  if (!parsed.ok()) return parsed.status();
  const json& doc = *parsed;
  if (!doc.is_object()) return Bad("indexer /query response: not a JSON object");
  std::map<std::string, PrefixMatch> out;
  auto t = doc.find(std::string(tenant));
  if (t == doc.end()) return out;
  if (!t->is_object()) return Bad("indexer /query response: tenant is not an object");
  auto num = [](const json& o, const char* key, int64_t* v) -> Status {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return Status::Ok();
    if (!it->is_number_integer()) {
      return Bad(std::string("indexer /query response: '") + key + "' is not an integer");
    }
    *v = it->get<int64_t>();
    return Status::Ok();
  };
  for (const auto& [id, m] : t->items()) {
    if (!m.is_object()) return Bad("indexer /query response: instance '" + id + "' not an object");
    PrefixMatch p;
    KVO_RETURN_IF_ERROR(num(m, "longest_matched", &p.longest));
    KVO_RETURN_IF_ERROR(num(m, "GPU", &p.gpu));
    KVO_RETURN_IF_ERROR(num(m, "CPU", &p.cpu));
    KVO_RETURN_IF_ERROR(num(m, "DISK", &p.disk));
    out[id] = p;
  }
  return out;
}

std::string RenderQueryRequest(std::string_view model, int64_t block_size,
                               std::span<const int64_t> token_ids) {
  // Written by hand: this runs on every routed request, and the token list is the whole body.
  std::string out;
  out.reserve(64 + token_ids.size() * 7);
  out += "{\"model\":";
  out += json(std::string(model)).dump(-1, ' ', false, json::error_handler_t::replace);
  out += ",\"block_size\":";
  out += std::to_string(block_size);
  out += ",\"token_ids\":[";
  char buf[24];
  for (size_t i = 0; i < token_ids.size(); ++i) {
    if (i) out += ',';
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, token_ids[i]);
    out.append(buf, end);
  }
  out += "]}";
  return out;
}

double KvScore(const PolicyConfig& config, const Candidate& c) {
  double bs = static_cast<double>(std::max<int64_t>(config.block_size, 1));
  double hit = config.weights.gpu * static_cast<double>(c.match.GpuTokens()) +
               config.weights.cpu * static_cast<double>(c.match.CpuTokens()) +
               config.weights.disk * static_cast<double>(c.match.DiskTokens());
  return hit / bs - config.load_penalty * static_cast<double>(c.in_flight);
}

Choice Pick(const PolicyConfig& config, std::span<const Candidate> candidates, uint64_t turn,
            uint64_t draw) {
  Choice choice;
  const size_t n = candidates.size();
  if (n == 0) return choice;
  size_t available = 0;
  for (const Candidate& c : candidates) available += c.available ? 1 : 0;
  if (available == 0) return choice;
  const size_t start = static_cast<size_t>(turn % n);
  // Visits the candidates in rotation order from `start`.
  auto rotated = [&](size_t k) { return (start + k) % n; };
  switch (config.policy) {
    case Policy::kRoundRobin:
      for (size_t k = 0; k < n; ++k) {
        if (candidates[rotated(k)].available) {
          choice.index = static_cast<int>(rotated(k));
          break;
        }
      }
      break;
    case Policy::kRandom: {
      size_t want = static_cast<size_t>(draw % available);
      for (size_t i = 0; i < n; ++i) {
        if (!candidates[i].available) continue;
        if (want-- == 0) {
          choice.index = static_cast<int>(i);
          break;
        }
      }
      break;
    }
    case Policy::kLeastLoaded:
      for (size_t k = 0; k < n; ++k) {
        size_t i = rotated(k);
        if (!candidates[i].available) continue;
        if (choice.index < 0 || candidates[i].in_flight < candidates[choice.index].in_flight) {
          choice.index = static_cast<int>(i);
        }
      }
      break;
    case Policy::kKv:
      for (size_t k = 0; k < n; ++k) {
        size_t i = rotated(k);
        const Candidate& c = candidates[i];
        if (!c.available) continue;
        double s = KvScore(config, c);
        bool better = choice.index < 0 || s > choice.score ||
                      (s == choice.score && c.in_flight < candidates[choice.index].in_flight);
        if (better) {
          choice.index = static_cast<int>(i);
          choice.score = s;
        }
      }
      if (choice.index >= 0) {
        choice.predicted_hit_tokens = candidates[choice.index].match.PrefixTokens();
      }
      break;
  }
  return choice;
}

std::optional<int64_t> DeliveredHitTokens(std::string_view body) {
  auto parsed = ParseJson(body);
  if (!parsed.ok() || !parsed->is_object()) return std::nullopt;
  const json& doc = *parsed;
  try {
    auto k = doc.find("kvo");
    if (k != doc.end() && k->is_object()) {
      auto h = k->find("hit_tokens");
      if (h != k->end() && h->is_object()) {
        int64_t sum = 0;
        for (const auto& [tier, v] : h->items()) {
          if (v.is_number_integer()) sum += v.get<int64_t>();
        }
        return sum;
      }
    }
    auto u = doc.find("usage");
    if (u != doc.end() && u->is_object()) {
      auto d = u->find("prompt_tokens_details");
      if (d != u->end() && d->is_object()) {
        auto c = d->find("cached_tokens");
        if (c != d->end() && c->is_number_integer()) return c->get<int64_t>();
      }
    }
  } catch (const json::exception&) {
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace kvo::route
