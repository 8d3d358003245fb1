#include "indexer/service/instance_blocks_api.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>

#include "common/hex.h"
#include "common/json.h"
#include "indexer/service/http_api.h"
#include "indexer/service/router_api.h"

namespace kvo {
namespace {

constexpr std::string_view kPrefix = "/v1/instances/";
constexpr std::string_view kSuffix = "/blocks";

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
                        RenderError(CutForMessage(request.method, 16) + " " +
                                    CutForMessage(request.path) + ": use GET")};
    return true;
  }
  const InstanceBlocks held = CollectInstanceBlocks(index, instance);
  const std::set<std::string>& sources = held.sources;
  std::map<std::string, std::set<uint64_t>> blocks = {{"GPU", {}}, {"CPU", {}}, {"DISK", {}}};
  for (const auto& [medium, hashes] : held.blocks_by_medium) {
    blocks[MediumName(medium)].insert(hashes.begin(), hashes.end());
  }
  if (sources.empty()) {
    *out = HttpResponse{404, "application/json",
                        RenderError("no source of instance '" + CutForMessage(instance) +
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
