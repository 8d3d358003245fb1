#include "indexer/instance_blocks.h"

#include "common/hex.h"

namespace kvo {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::string BlockSetDigest(const std::vector<uint64_t>& hashes) {
  std::set<uint64_t> distinct(hashes.begin(), hashes.end());
  uint64_t sum = 0;
  for (uint64_t h : distinct) sum += SplitMix64(h);
  return HexU64(sum);
}

InstanceBlocks CollectInstanceBlocks(const Indexer& index, const std::string& instance) {
  InstanceBlocks out;
  const std::string registered = instance + "@";
  index.Dump([&](const DumpEntry& e) {
    if (e.source != instance && !e.source.starts_with(registered)) return true;
    out.sources.insert(e.source);
    out.blocks_by_medium[e.medium].insert(e.engine_hash);
    return true;
  });
  // A stream that holds nothing yet, or a registration that has published nothing (an engine
  // the router never chose), is still the instance's: known, empty.
  for (const StreamStats& st : index.Stats().streams) {
    if (st.source == instance || st.source.starts_with(registered)) out.sources.insert(st.source);
  }
  if (auto regs = index.Registrations(); regs.ok()) {
    for (const StoredRegistration& r : *regs) {
      if (r.name.starts_with(registered)) out.sources.insert(r.name);
    }
  }
  return out;
}

}  // namespace kvo
