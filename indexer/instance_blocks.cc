#include "indexer/instance_blocks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>

#include "common/hex.h"
#include "indexer/http_api.h"
#include "indexer/router_api.h"

namespace kvo {
namespace {

constexpr std::string_view kPrefix = "/v1/instances/";
constexpr std::string_view kSuffix = "/blocks";

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string Hex16(uint64_t v) { return HexU64(v); }

std::string MediumName(const std::string& medium) {
  switch (RouterTierOf(medium)) {
    case RouterTier::kGpu:
      return "GPU";
    case RouterTier::kCpu:
      return "CPU";
    case RouterTier::kDisk:
      return "DISK";
    case RouterTier::kOther:
      break;
  }
  return medium;
}

}  // namespace

std::string BlockSetDigest(const std::vector<uint64_t>& hashes) {
  std::set<uint64_t> distinct(hashes.begin(), hashes.end());
  uint64_t sum = 0;
  for (uint64_t h : distinct) sum += SplitMix64(h);
  return Hex16(sum);
}

bool ServeInstanceBlocks(const HttpRequest& request, const Indexer& index, HttpResponse* out) {
  std::string_view path = request.path;
  if (!path.starts_with(kPrefix) || !path.ends_with(kSuffix) ||
      path.size() <= kPrefix.size() + kSuffix.size()) {
    return false;
  }
  const std::string instance(
      path.substr(kPrefix.size(), path.size() - kPrefix.size() - kSuffix.size()));
  if (instance.find('/') != std::string::npos) return false;
  if (request.method != "GET") {
    *out = HttpResponse{405, "application/json",
                        RenderError(request.method + " " + request.path + ": use GET")};
    return true;
  }
  std::set<std::string> sources;
  std::map<std::string, std::set<uint64_t>> blocks = {{"GPU", {}}, {"CPU", {}}, {"DISK", {}}};
  const std::string registered = instance + "@";
  index.Dump([&](const DumpEntry& e) {
    if (e.source != instance && !e.source.starts_with(registered)) return true;
    sources.insert(e.source);
    blocks[MediumName(e.medium)].insert(e.engine_hash);
    return true;
  });
  // A stream that holds nothing yet, or a registration that has published nothing (an engine
  // the router never chose), is still the instance's: known, empty.
  for (const StreamStats& st : index.Stats().streams) {
    if (st.source == instance || st.source.starts_with(registered)) sources.insert(st.source);
  }
  if (auto regs = index.Registrations(); regs.ok()) {
    for (const StoredRegistration& r : *regs) {
      if (r.name.starts_with(registered)) sources.insert(r.name);
    }
  }
  if (sources.empty()) {
    *out = HttpResponse{404, "application/json",
                        RenderError("no source of instance '" + instance +
                                    "' (neither a source of that name nor a registration)")};
    return true;
  }
  nlohmann::ordered_json o;
  o["instance"] = instance;
  o["sources"] = sources;
  nlohmann::ordered_json lists = nlohmann::ordered_json::object();
  nlohmann::ordered_json digests = nlohmann::ordered_json::object();
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (const auto& [medium, set] : blocks) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (uint64_t h : set) list.push_back(Hex16(h));
    lists[medium] = std::move(list);
    digests[medium] = BlockSetDigest(std::vector<uint64_t>(set.begin(), set.end()));
    counts[medium] = set.size();
  }
  o["blocks"] = std::move(lists);
  o["digest"] = std::move(digests);
  o["count"] = std::move(counts);
  *out = HttpResponse{200, "application/json",
                      o.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)};
  return true;
}

}  // namespace kvo
