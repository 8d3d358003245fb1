// libFuzzer target: kvo::ParseOffloadConfig (`--kv-transfer-config`, or its
// kv_connector_extra_config object) on arbitrary text, without and with an engine geometry, then
// ComputeOffloadGeometry. Never a crash or throw; errors are InvalidArgument with a bounded
// message, and so is every warning. An accepted config keeps its documented invariants (non-zero
// cpu_bytes_to_use, at most one chunking key, a registered eviction policy, fs tiers with a
// root_dir), is accepted again with the geometry's checks only adding errors, and its geometry
// obeys B.3's arithmetic.
#include <cstdint>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "manager/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckGeometry(const kvo::OffloadConfig& c, const kvo::KvGeometry& g, uint64_t page) {
  kvo::Result<kvo::OffloadGeometry> r = kvo::ComputeOffloadGeometry(c, g, page);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               r.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(r.status().message());
    return;
  }
  FUZZ_CHECK(r->blocks_per_chunk > 0, "blocks_per_chunk 0");
  FUZZ_CHECK(r->tokens_per_chunk == r->blocks_per_chunk * g.gpu_block_size, "tokens_per_chunk");
  FUZZ_CHECK(r->hashes_per_chunk == r->tokens_per_chunk / g.tokens_per_hash, "hashes_per_chunk");
  FUZZ_CHECK(r->row_bytes >= r->kv_bytes_per_chunk && r->row_bytes % page == 0 &&
                 r->row_bytes - r->kv_bytes_per_chunk < page,
             "row_bytes %llu for %llu bytes", static_cast<unsigned long long>(r->row_bytes),
             static_cast<unsigned long long>(r->kv_bytes_per_chunk));
  FUZZ_CHECK(r->num_blocks == (r->row_bytes == 0 ? 0 : c.cpu_bytes_to_use / r->row_bytes),
             "num_blocks");
  if (c.block_size) {
    FUZZ_CHECK(r->tokens_per_chunk == *c.block_size, "block_size %llu, chunk %llu tokens",
               static_cast<unsigned long long>(*c.block_size),
               static_cast<unsigned long long>(r->tokens_per_chunk));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // warnings are checked through OffloadConfig::warnings
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kvo::Result<kvo::OffloadConfig> c = kvo::ParseOffloadConfig(input);
  kvo::KvGeometry g16;  // 16-token blocks and hashes, one worker
  g16.worker_kv_bytes_per_block = 1 << 20;
  kvo::KvGeometry g64;  // 64-token GPU blocks of 4 16-token hashes, TP 4
  g64.worker_kv_bytes_per_block = 12345;
  g64.gpu_block_size = 64;
  g64.world_size = 4;
  kvo::KvGeometry mla = g64;  // one replicated copy
  mla.replicated_layout = true;
  mla.worker_kv_bytes_per_block = ~uint64_t{0} / 3;

  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               c.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(c.status().message());
    kvo::Result<kvo::OffloadConfig> with = kvo::ParseOffloadConfig(input, g16);
    FUZZ_CHECK(!with.ok(), "accepted with a geometry, refused without one");
    return 0;
  }
  for (const std::string& w : c->warnings) FUZZ_CHECK_MESSAGE(w);
  FUZZ_CHECK(c->cpu_bytes_to_use > 0, "cpu_bytes_to_use 0 accepted");
  FUZZ_CHECK(!(c->block_size && c->blocks_per_chunk), "both block_size and blocks_per_chunk");
  FUZZ_CHECK(!c->block_size || *c->block_size > 0, "block_size 0");
  FUZZ_CHECK(!c->blocks_per_chunk || *c->blocks_per_chunk > 0, "blocks_per_chunk 0");
  bool known_policy = false;
  for (const std::string& p : kvo::SupportedEvictionPolicies()) {
    known_policy = known_policy || p == c->eviction_policy;
  }
  FUZZ_CHECK(known_policy, "eviction_policy '%s'", c->eviction_policy.c_str());
  for (const kvo::SecondaryTierConfig& t : c->secondary_tiers) {
    FUZZ_CHECK(t.type == "fs" && !t.fs.root_dir.empty(), "tier type '%s' root '%s'", t.type.c_str(),
               t.fs.root_dir.c_str());
  }
  for (const kvo::KvGeometry* g : {&g16, &g64, &mla}) {
    kvo::Result<kvo::OffloadConfig> with = kvo::ParseOffloadConfig(input, *g);
    if (!with.ok()) {
      FUZZ_CHECK_MESSAGE(with.status().message());
      FUZZ_CHECK(c->block_size.has_value(), "refused with a geometry without a block_size: %s",
                 with.status().ToString().c_str());
    }
    for (uint64_t page : {uint64_t{4096}, uint64_t{1}, uint64_t{65536}})
      CheckGeometry(*c, *g, page);
  }
  return 0;
}
