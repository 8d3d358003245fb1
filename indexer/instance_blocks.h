// The blocks the index holds for one instance, per medium, and an order-independent digest of a
// block set: what `kvo demo` compares with each engine's own state. The HTTP route serving them
// (GET /v1/instances/{instance}/blocks) is indexer/service/instance_blocks_api.h.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "indexer/indexer.h"

namespace kvo {

// An order-independent digest of a set of 64-bit block hashes: the sum (mod 2^64) of
// SplitMix64(h) over the distinct hashes, as 16 lowercase hex digits ("0000000000000000" for
// the empty set). Anyone holding the list computes the same value.
std::string BlockSetDigest(const std::vector<uint64_t>& hashes);

// One instance's holdings. The instance is a source named exactly `instance` and every source
// registered under that instance_id ("<instance>@<tenant>@<rank>"), also one that holds nothing
// yet (a stream seen, or a stored registration): it is in `sources` with no blocks.
struct InstanceBlocks {
  std::set<std::string> sources;
  // Medium as stored (e.g. "GPU", "STORAGE") -> engine hashes (64-bit wire form) held on it by
  // any group, rank or reference count of the instance's sources.
  std::map<std::string, std::set<uint64_t>> blocks_by_medium;
};
InstanceBlocks CollectInstanceBlocks(const Indexer& index, const std::string& instance);

}  // namespace kvo
