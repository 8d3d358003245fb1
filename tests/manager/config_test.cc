#include "manager/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "manager/cache_policy.h"

namespace kvo {
namespace {

constexpr char kGiB[] = R"("cpu_bytes_to_use": 1073741824)";

std::string WithBytes(const std::string& rest) {
  return std::string("{") + kGiB + (rest.empty() ? "" : ", " + rest) + "}";
}

OffloadConfig MustParse(const std::string& json) {
  auto c = ParseOffloadConfig(json);
  EXPECT_TRUE(c.ok()) << json << "\n" << c.status().ToString();
  return c.ok() ? *c : OffloadConfig{};
}

// Asserts a rejection (InvalidArgument) whose message contains every fragment.
void ExpectRejected(const std::string& json, std::initializer_list<std::string> fragments) {
  auto c = ParseOffloadConfig(json);
  ASSERT_FALSE(c.ok()) << "accepted: " << json;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
  for (const std::string& f : fragments) {
    EXPECT_NE(c.status().message().find(f), std::string::npos)
        << "input: " << json << "\nmessage: " << c.status().message() << "\nmissing: " << f;
  }
}

bool HasWarning(const OffloadConfig& c, const std::string& fragment) {
  for (const std::string& w : c.warnings) {
    if (w.find(fragment) != std::string::npos) return true;
  }
  return false;
}

// ---- Defaults -----------------------------------------------------------------------------------

TEST(OffloadConfigTest, DefaultsMatchVllm) {
  OffloadConfig c = MustParse(WithBytes(""));
  EXPECT_EQ(c.spec, OffloadSpec::kCpu);
  EXPECT_EQ(c.cpu_bytes_to_use, 1073741824u);
  EXPECT_FALSE(c.block_size.has_value());
  EXPECT_FALSE(c.blocks_per_chunk.has_value());
  EXPECT_EQ(c.eviction_policy, "lru");
  EXPECT_TRUE(c.offload_prompt_only);
  EXPECT_EQ(c.store_threshold, 0);
  EXPECT_FALSE(c.store_threshold_enabled());
  EXPECT_EQ(c.max_tracker_size, 64000);
  EXPECT_FALSE(c.self_describing_kv_events);
  EXPECT_FALSE(c.canonical_layout);
  EXPECT_TRUE(c.secondary_tiers.empty());
  EXPECT_FALSE(c.kv_role.has_value());
  EXPECT_TRUE(c.unknown_keys.empty());
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(OffloadSpecName(c.spec), "CPUOffloadingSpec");
}

TEST(OffloadConfigTest, ReadsEveryKey) {
  OffloadConfig c = MustParse(R"({
      "spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": 2147483648, "blocks_per_chunk": 4,
      "eviction_policy": "arc", "offload_prompt_only": false, "store_threshold": 3,
      "max_tracker_size": 100, "self_describing_kv_events": true, "canonical_layout": false})");
  EXPECT_EQ(c.cpu_bytes_to_use, 2147483648u);
  EXPECT_EQ(c.blocks_per_chunk, 4u);
  EXPECT_EQ(c.eviction_policy, "arc");
  EXPECT_FALSE(c.offload_prompt_only);
  EXPECT_EQ(c.store_threshold, 3);
  EXPECT_TRUE(c.store_threshold_enabled());
  EXPECT_EQ(c.max_tracker_size, 100);
  EXPECT_TRUE(c.self_describing_kv_events);
  EXPECT_TRUE(c.warnings.empty());
}

// ---- cpu_bytes_to_use ---------------------------------------------------------------------------

TEST(OffloadConfigTest, CpuBytesIsRequiredWithVllmsMessage) {
  const std::string vllm = "cpu_bytes_to_use must be specified in kv_connector_extra_config";
  ExpectRejected("{}", {vllm});
  ExpectRejected(R"({"cpu_bytes_to_use": 0})", {vllm, "(got 0)"});
  ExpectRejected(R"({"cpu_bytes_to_use": 0.0})", {vllm, "(got 0.0)"});
  ExpectRejected(R"({"cpu_bytes_to_use": null})", {vllm, "(got null)"});
  ExpectRejected(R"({"cpu_bytes_to_use": false})", {vllm, "(got false)"});
  ExpectRejected(R"({"cpu_bytes_to_use": ""})", {vllm, "(got \"\")"});
}

TEST(OffloadConfigTest, CpuBytesRejectsWrongTypesAndNegatives) {
  ExpectRejected(R"({"cpu_bytes_to_use": -5})", {"'cpu_bytes_to_use'", "got -5", "positive"});
  ExpectRejected(R"({"cpu_bytes_to_use": "1073741824"})",
                 {"'cpu_bytes_to_use'", "got \"1073741824\"", "number of bytes"});
  ExpectRejected(R"({"cpu_bytes_to_use": true})", {"'cpu_bytes_to_use'", "got true"});
  ExpectRejected(R"({"cpu_bytes_to_use": [1]})", {"'cpu_bytes_to_use'", "got [1]"});
  ExpectRejected(R"({"cpu_bytes_to_use": 0.5})", {"'cpu_bytes_to_use'", "got 0.5"});
  ExpectRejected(R"({"cpu_bytes_to_use": 1e30})", {"'cpu_bytes_to_use'"});
}

TEST(OffloadConfigTest, CpuBytesAcceptsFloatsAsVllmsShortcutWritesThem) {
  // --kv-offloading-size 1.5 gives 1.5 * 2**30 as a float; int() truncates.
  EXPECT_EQ(MustParse(R"({"cpu_bytes_to_use": 1610612736.0})").cpu_bytes_to_use, 1610612736u);
  EXPECT_EQ(MustParse(R"({"cpu_bytes_to_use": 1e9})").cpu_bytes_to_use, 1000000000u);
  EXPECT_EQ(MustParse(R"({"cpu_bytes_to_use": 1000.9})").cpu_bytes_to_use, 1000u);
  EXPECT_EQ(MustParse(R"({"cpu_bytes_to_use": 18446744073709551615})").cpu_bytes_to_use,
            18446744073709551615u);
}

// ---- block_size / blocks_per_chunk --------------------------------------------------------------

TEST(OffloadConfigTest, BlockSizeAndBlocksPerChunkAreExclusive) {
  ExpectRejected(WithBytes(R"("block_size": 32, "blocks_per_chunk": 2)"),
                 {"Specify only one of 'block_size' or 'blocks_per_chunk' in "
                  "kv_connector_extra_config.",
                  "block_size=32", "blocks_per_chunk=2"});
  // null is vLLM's "not set".
  EXPECT_EQ(MustParse(WithBytes(R"("block_size": null, "blocks_per_chunk": 2)")).blocks_per_chunk,
            2u);
  EXPECT_EQ(MustParse(WithBytes(R"("block_size": 64, "blocks_per_chunk": null)")).block_size, 64u);
}

TEST(OffloadConfigTest, BlocksPerChunkMustBePositive) {
  ExpectRejected(WithBytes(R"("blocks_per_chunk": 0)"),
                 {"'blocks_per_chunk' must be greater than 0.", "blocks_per_chunk=0"});
  ExpectRejected(WithBytes(R"("blocks_per_chunk": -3)"),
                 {"'blocks_per_chunk' must be greater than 0.", "blocks_per_chunk=-3"});
  ExpectRejected(WithBytes(R"("blocks_per_chunk": "4")"),
                 {"'blocks_per_chunk' must be an integer", "got \"4\""});
  ExpectRejected(WithBytes(R"("blocks_per_chunk": 2.5)"),
                 {"'blocks_per_chunk' must be an integer", "got 2.5"});
  ExpectRejected(WithBytes(R"("blocks_per_chunk": true)"),
                 {"'blocks_per_chunk' must be an integer", "got true"});
  EXPECT_EQ(MustParse(WithBytes(R"("blocks_per_chunk": 8.0)")).blocks_per_chunk, 8u);
}

TEST(OffloadConfigTest, BlockSizeMustBeAPositiveMultipleOfTheGpuBlockSize) {
  ExpectRejected(WithBytes(R"("block_size": 0)"), {"'block_size'", "greater than 0", "got 0"});
  ExpectRejected(WithBytes(R"("block_size": -16)"), {"'block_size'", "got -16"});
  ExpectRejected(WithBytes(R"("block_size": "256")"), {"'block_size'", "got \"256\""});

  KvGeometry g;
  g.gpu_block_size = 16;
  auto bad = ParseOffloadConfig(WithBytes(R"("block_size": 24)"), g);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'block_size' 24 must be a multiple of the GPU block size "
                                        "16"),
            std::string::npos)
      << bad.status().message();
  auto good = ParseOffloadConfig(WithBytes(R"("block_size": 256)"), g);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->block_size, 256u);
  // Without a geometry the check waits for ComputeOffloadGeometry.
  EXPECT_TRUE(ParseOffloadConfig(WithBytes(R"("block_size": 24)")).ok());
}

// ---- spec_name ----------------------------------------------------------------------------------

TEST(OffloadConfigTest, SpecName) {
  EXPECT_EQ(MustParse(WithBytes(R"("spec_name": "TieringOffloadingSpec")")).spec,
            OffloadSpec::kTiering);
  ExpectRejected(WithBytes(R"("spec_name": "DiskOffloadingSpec")"),
                 {"'spec_name'", "Unsupported spec type: DiskOffloadingSpec", "CPUOffloadingSpec",
                  "TieringOffloadingSpec"});
  ExpectRejected(WithBytes(R"("spec_name": "cpuoffloadingspec")"),
                 {"Unsupported spec type: cpuoffloadingspec"});
  ExpectRejected(WithBytes(R"("spec_name": null)"), {"Unsupported spec type: null"});
  ExpectRejected(WithBytes(R"("spec_name": 7)"), {"Unsupported spec type: 7"});
}

TEST(OffloadConfigTest, SpecModulePathIsPythonOnly) {
  ExpectRejected(
      WithBytes(R"("spec_name": "MySpec", "spec_module_path": "my.module")"),
      {"'spec_name' \"MySpec\"", "'spec_module_path' \"my.module\"", "Python", "kvo cannot load"});
  ExpectRejected(WithBytes(R"("spec_module_path": 5)"), {"'spec_module_path'", "got 5"});
  // vLLM ignores the module path when spec_name is built in; so does kvo, with a warning.
  OffloadConfig c = MustParse(WithBytes(R"("spec_module_path": "vllm.v1.kv_offload.cpu.spec")"));
  EXPECT_EQ(c.spec, OffloadSpec::kCpu);
  EXPECT_TRUE(HasWarning(c, "'spec_module_path'"));
  EXPECT_TRUE(MustParse(WithBytes(R"("spec_module_path": null)")).warnings.empty());
}

// ---- eviction_policy ----------------------------------------------------------------------------

TEST(OffloadConfigTest, EvictionPolicy) {
  EXPECT_EQ(MustParse(WithBytes(R"("eviction_policy": "arc")")).eviction_policy, "arc");
  ExpectRejected(
      WithBytes(R"("eviction_policy": "lfu")"),
      {"'eviction_policy'", "Unknown cache policy: 'lfu'. Supported: [", "'lru'", "'arc'"});
  ExpectRejected(WithBytes(R"("eviction_policy": "LRU")"), {"Unknown cache policy: 'LRU'"});
  ExpectRejected(WithBytes(R"("eviction_policy": 1)"), {"'eviction_policy'", "got 1"});
  ExpectRejected(WithBytes(R"("eviction_policy": null)"), {"'eviction_policy'", "got null"});
}

TEST(OffloadConfigTest, EvictionPolicyAcceptsPoliciesRegisteredByName) {
  ExpectRejected(WithBytes(R"("eviction_policy": "config_test_policy")"),
                 {"Unknown cache policy: 'config_test_policy'"});
  ASSERT_TRUE(CachePolicyRegistry::Global()
                  .Register("config_test_policy",
                            [](size_t capacity) {
                              return CachePolicyRegistry().Create("lru", capacity).value();
                            })
                  .ok());
  EXPECT_EQ(MustParse(WithBytes(R"("eviction_policy": "config_test_policy")")).eviction_policy,
            "config_test_policy");
}

TEST(OffloadConfigTest, CachePolicyModulePathIsPythonOnly) {
  ExpectRejected(WithBytes(R"("eviction_policy": "MyPolicy", "cache_policy_module_path": "pkg.p")"),
                 {"'eviction_policy' 'MyPolicy'", "'cache_policy_module_path' \"pkg.p\"",
                  "kvo cannot load", "CachePolicyRegistry"});
  ExpectRejected(WithBytes(R"("cache_policy_module_path": ["x"])"),
                 {"'cache_policy_module_path'", "got [\"x\"]"});
  OffloadConfig c = MustParse(WithBytes(R"("cache_policy_module_path": "pkg.p")"));
  EXPECT_EQ(c.eviction_policy, "lru");
  EXPECT_TRUE(HasWarning(c, "'cache_policy_module_path'"));
}

// ---- booleans -----------------------------------------------------------------------------------

TEST(OffloadConfigTest, BooleansAreStrict) {
  ExpectRejected(WithBytes(R"("offload_prompt_only": "false")"),
                 {"'offload_prompt_only' must be true or false", "got \"false\""});
  ExpectRejected(WithBytes(R"("offload_prompt_only": 0)"), {"'offload_prompt_only'", "got 0"});
  ExpectRejected(WithBytes(R"("self_describing_kv_events": 1)"),
                 {"'self_describing_kv_events' must be true or false", "got 1"});
  ExpectRejected(WithBytes(R"("canonical_layout": "yes")"),
                 {"'canonical_layout' must be true or false", "got \"yes\""});
}

TEST(OffloadConfigTest, CanonicalLayoutIsAcceptedWithAWarning) {
  OffloadConfig c = MustParse(WithBytes(R"("canonical_layout": true)"));
  EXPECT_TRUE(c.canonical_layout);
  EXPECT_TRUE(HasWarning(c, "canonical_layout"));
  EXPECT_TRUE(MustParse(WithBytes(R"("canonical_layout": false)")).warnings.empty());
}

// ---- store_threshold / max_tracker_size ---------------------------------------------------------

TEST(OffloadConfigTest, StoreThreshold) {
  EXPECT_FALSE(MustParse(WithBytes(R"("store_threshold": 1)")).store_threshold_enabled());
  EXPECT_FALSE(MustParse(WithBytes(R"("store_threshold": -4)")).store_threshold_enabled());
  EXPECT_TRUE(MustParse(WithBytes(R"("store_threshold": 2)")).store_threshold_enabled());
  ExpectRejected(WithBytes(R"("store_threshold": "2")"),
                 {"'store_threshold' must be an integer", "got \"2\""});
  ExpectRejected(
      WithBytes(R"("store_threshold": 2, "spec_name": "TieringOffloadingSpec")"),
      {"store_threshold is not supported for TieringOffloadingSpec", "store_threshold=2"});
  // 0 and 1 mean "no filter", which Tiering accepts.
  EXPECT_EQ(
      MustParse(WithBytes(R"("store_threshold": 1, "spec_name": "TieringOffloadingSpec")")).spec,
      OffloadSpec::kTiering);
}

TEST(OffloadConfigTest, MaxTrackerSize) {
  EXPECT_EQ(MustParse(WithBytes(R"("max_tracker_size": 5, "store_threshold": 2)")).max_tracker_size,
            5);
  ExpectRejected(WithBytes(R"("max_tracker_size": 0, "store_threshold": 2)"),
                 {"'max_tracker_size'", "got 0", "greater than 0"});
  ExpectRejected(WithBytes(R"("max_tracker_size": "64000")"),
                 {"'max_tracker_size' must be an integer", "got \"64000\""});
  // vLLM never reads it without a threshold.
  EXPECT_TRUE(ParseOffloadConfig(WithBytes(R"("max_tracker_size": 0)")).ok());
}

// ---- secondary_tiers ----------------------------------------------------------------------------

std::string Tiering(const std::string& tiers) {
  return WithBytes(R"("spec_name": "TieringOffloadingSpec", "secondary_tiers": )" + tiers);
}

TEST(OffloadConfigTest, FsTierDefaultsAndValues) {
  OffloadConfig c = MustParse(Tiering(R"([{"type": "fs", "root_dir": "/mnt/kv"},
      {"type": "fs", "root_dir": "/mnt/nfs", "n_read_threads": 4, "n_write_threads": 2,
       "enable_kv_events": true, "locality": "REMOTE", "max_bytes": 1e12}])"));
  ASSERT_EQ(c.secondary_tiers.size(), 2u);
  const FsTierConfig& a = c.secondary_tiers[0].fs;
  EXPECT_EQ(c.secondary_tiers[0].type, "fs");
  EXPECT_EQ(a.root_dir, "/mnt/kv");
  EXPECT_EQ(a.n_read_threads, 16);
  EXPECT_EQ(a.n_write_threads, 16);
  EXPECT_FALSE(a.enable_kv_events);
  EXPECT_FALSE(a.locality.has_value());
  EXPECT_EQ(a.max_bytes, 0u);
  const FsTierConfig& b = c.secondary_tiers[1].fs;
  EXPECT_EQ(b.root_dir, "/mnt/nfs");
  EXPECT_EQ(b.n_read_threads, 4);
  EXPECT_EQ(b.n_write_threads, 2);
  EXPECT_TRUE(b.enable_kv_events);
  EXPECT_EQ(b.locality, TierLocality::kRemote);
  EXPECT_EQ(b.max_bytes, 1000000000000u);
  EXPECT_EQ(TierLocalityName(*b.locality), "REMOTE");
  EXPECT_EQ(MustParse(Tiering(R"([{"type":"fs","root_dir":"/d","locality":"LOCAL"}])"))
                .secondary_tiers[0]
                .fs.locality,
            TierLocality::kLocal);
  EXPECT_FALSE(MustParse(Tiering(R"([{"type":"fs","root_dir":"/d","locality":null}])"))
                   .secondary_tiers[0]
                   .fs.locality.has_value());
  EXPECT_TRUE(MustParse(Tiering("[]")).secondary_tiers.empty());
}

TEST(OffloadConfigTest, SecondaryTiersMustBeAList) {
  const std::string msg = "secondary_tiers must be a list of tier configurations";
  ExpectRejected(Tiering(R"({"type": "fs", "root_dir": "/d"})"), {msg, "got {"});
  ExpectRejected(Tiering("null"), {msg, "got null"});
  ExpectRejected(Tiering(R"("fs")"), {msg, "got \"fs\""});
  ExpectRejected(Tiering("[5]"), {"'secondary_tiers[0]' must be an object", "got 5"});
}

TEST(OffloadConfigTest, SecondaryTierNeedsAType) {
  const std::string msg = "Secondary tier configuration must include 'type'";
  ExpectRejected(Tiering(R"([{"root_dir": "/d"}])"), {msg, "secondary_tiers[0]", "/d"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/a"}, {"type": ""}])"),
                 {msg, "secondary_tiers[1]"});
  ExpectRejected(Tiering(R"([{"type": null}])"), {msg});
  ExpectRejected(Tiering(R"([{"type": 3}])"),
                 {"'secondary_tiers[0].type' must be a string", "got 3"});
}

TEST(OffloadConfigTest, OtherVllmTierTypesAreNotSupportedByKvo) {
  for (const char* type : {"example", "obj", "p2p"}) {
    ExpectRejected(
        Tiering(std::string(R"([{"type": ")") + type + R"("}])"),
        {"secondary_tiers[0].type", std::string("'") + type + "'", "not supported by kvo"});
  }
  ExpectRejected(Tiering(R"([{"type": "s3"}])"),
                 {"Unknown secondary tier type: 's3'", "['example', 'fs', 'obj', 'p2p']"});
  ExpectRejected(Tiering(R"([{"type": "FS", "root_dir": "/d"}])"),
                 {"Unknown secondary tier type: 'FS'"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "module_path": "my.tier"}])"),
                 {"'secondary_tiers[0].module_path'", "\"my.tier\"", "Python"});
  EXPECT_TRUE(
      ParseOffloadConfig(Tiering(R"([{"type": "fs", "root_dir": "/d", "module_path": null}])"))
          .ok());
}

TEST(OffloadConfigTest, FsTierRejections) {
  ExpectRejected(Tiering(R"([{"type": "fs"}])"), {"'secondary_tiers[0]'", "needs 'root_dir'"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": 5}])"),
                 {"'secondary_tiers[0].root_dir'", "got 5", "directory path"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": ""}])"),
                 {"'secondary_tiers[0].root_dir'", "got \"\""});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "rootdir": "/e"}])"),
                 {"'secondary_tiers[0]'", "unknown fs tier key 'rootdir'", "\"/e\"", "TypeError",
                  "root_dir, n_read_threads"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "locality": "local"}])"),
                 {"'secondary_tiers[0].locality'", "'local' is not a valid Locality", "\"LOCAL\"",
                  "\"REMOTE\""});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "locality": 1}])"),
                 {"'secondary_tiers[0].locality'", "1 is not a valid Locality"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "n_read_threads": -1}])"),
                 {"'secondary_tiers[0].n_read_threads'", "got -1", "non-negative"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "n_write_threads": "16"}])"),
                 {"'secondary_tiers[0].n_write_threads' must be an integer", "got \"16\""});
  ExpectRejected(
      Tiering(R"([{"type": "fs", "root_dir": "/d", "n_read_threads": 0, "n_write_threads": 0}])"),
      {"'secondary_tiers[0]'", "n_read_threads + n_write_threads must be at least 1", "0 + 0"});
  // At most kFsMaxThreadsPerPool per pool, checked on the 64-bit value (2^32 is not 0).
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "n_read_threads": 1025}])"),
                 {"'secondary_tiers[0].n_read_threads'", "at most 1024", "got 1025"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "n_write_threads": 4294967296}])"),
                 {"'secondary_tiers[0].n_write_threads'", "at most 1024", "got 4294967296"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "enable_kv_events": "yes"}])"),
                 {"'secondary_tiers[0].enable_kv_events' must be true or false", "got \"yes\""});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "max_bytes": -1}])"),
                 {"'secondary_tiers[0].max_bytes'", "got -1", "0 = unbounded"});
  ExpectRejected(Tiering(R"([{"type": "fs", "root_dir": "/d", "max_bytes": 1.5}])"),
                 {"'secondary_tiers[0].max_bytes' must be an integer", "got 1.5"});
}

TEST(OffloadConfigTest, SecondaryTiersAreIgnoredByTheCpuSpecAsVllmDoes) {
  // vLLM's CPUOffloadingSpec never reads secondary_tiers, so it does not validate them either.
  OffloadConfig c = MustParse(WithBytes(R"("secondary_tiers": [{"type": "obj"}])"));
  EXPECT_EQ(c.spec, OffloadSpec::kCpu);
  EXPECT_TRUE(c.secondary_tiers.empty());
  EXPECT_TRUE(HasWarning(c, "'secondary_tiers' is ignored"));
  EXPECT_TRUE(c.unknown_keys.empty());
}

// ---- unknown keys -------------------------------------------------------------------------------

TEST(OffloadConfigTest, UnknownKeysAreKeptAndWarned) {
  OffloadConfig c = MustParse(WithBytes(R"("num_cpu_blocks": 100, "my_flag": true)"));
  EXPECT_EQ(std::set<std::string>(c.unknown_keys.begin(), c.unknown_keys.end()),
            (std::set<std::string>{"num_cpu_blocks", "my_flag"}));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("'my_flag'"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[0].find("'num_cpu_blocks'"), std::string::npos);
  EXPECT_NE(c.warnings[0].find("use cpu_bytes_to_use"), std::string::npos);
}

// ---- wrapper form -------------------------------------------------------------------------------

TEST(OffloadConfigTest, AcceptsTheWholeKvTransferConfig) {
  OffloadConfig c = MustParse(R"({
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both", "engine_id": "e0",
      "kv_connector_extra_config": {"cpu_bytes_to_use": 4294967296, "block_size": 64,
                                    "spec_name": "TieringOffloadingSpec",
                                    "secondary_tiers": [{"type": "fs", "root_dir": "/kv"}]}})");
  EXPECT_EQ(c.kv_role, "kv_both");
  EXPECT_EQ(c.cpu_bytes_to_use, 4294967296u);
  EXPECT_EQ(c.block_size, 64u);
  EXPECT_EQ(c.spec, OffloadSpec::kTiering);
  ASSERT_EQ(c.secondary_tiers.size(), 1u);
  EXPECT_EQ(c.secondary_tiers[0].fs.root_dir, "/kv");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(OffloadConfigTest, WrapperRejections) {
  ExpectRejected(
      R"({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})",
      {"'kv_connector' \"LMCacheConnectorV1\"", "not supported by kvo", "OffloadingConnector"});
  ExpectRejected(R"({"kv_connector": null, "kv_role": "kv_both"})",
                 {"'kv_connector' null", "not supported by kvo"});
  ExpectRejected(R"({"kv_connector": "OffloadingConnector",
                     "kv_connector_extra_config": {"cpu_bytes_to_use": 1}})",
                 {"Please specify kv_role when kv_connector is set", "kv_both"});
  ExpectRejected(R"({"kv_connector": "OffloadingConnector", "kv_role": "both",
                     "kv_connector_extra_config": {"cpu_bytes_to_use": 1}})",
                 {"Unsupported kv_role: \"both\"", "kv_producer"});
  ExpectRejected(R"({"kv_connector": "OffloadingConnector", "kv_role": "kv_both"})",
                 {"cpu_bytes_to_use must be specified in kv_connector_extra_config"});
  ExpectRejected(R"({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": [1]})",
                 {"kv_connector_extra_config: expected a JSON object", "got [1]"});
  ExpectRejected(R"({"kv_connector_extra_config": {"cpu_bytes_to_use": 1}})",
                 {"'kv_connector' is missing"});
  // Errors inside the extra config are the same as in the inner form.
  ExpectRejected(R"({"kv_connector": "OffloadingConnector", "kv_role": "kv_producer",
                     "kv_connector_extra_config": {"cpu_bytes_to_use": 1, "eviction_policy": "x"}})",
                 {"Unknown cache policy: 'x'"});
}

TEST(OffloadConfigTest, WrapperWarnsAboutUnknownKeys) {
  OffloadConfig c = MustParse(R"({
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_conector_extra": 1,
      "kv_connector_module_path": "x.y", "kv_connector_extra_config": {"cpu_bytes_to_use": 1}})");
  EXPECT_TRUE(HasWarning(c, "unknown key 'kv_conector_extra'"));
  EXPECT_TRUE(HasWarning(c, "'kv_connector_module_path'"));
  EXPECT_TRUE(c.unknown_keys.empty());  // unknown_keys is about the extra config
}

TEST(OffloadConfigTest, RejectsWhatIsNotAJsonObject) {
  ExpectRejected("[1, 2]", {"expected a JSON object", "got [1,2]"});
  ExpectRejected("42", {"expected a JSON object"});
  ExpectRejected(R"({"cpu_bytes_to_use": )", {"invalid JSON"});
  ExpectRejected("", {"invalid JSON"});
}

// ---- geometry (B.3) -----------------------------------------------------------------------------

OffloadConfig Bytes(uint64_t bytes) {
  OffloadConfig c;
  c.cpu_bytes_to_use = bytes;
  return c;
}

TEST(OffloadGeometryTest, Llama8BOnOneGpu) {
  // Llama-3.1-8B fp16: 32 layers * 2 (K,V) * 8 KV heads * 128 dims * 2 bytes = 131072 bytes per
  // token; a 16-token GPU block is 2 MiB on the one worker. 256-token chunks, 40 GiB of CPU.
  KvGeometry g{.worker_kv_bytes_per_block = 2097152,
               .gpu_block_size = 16,
               .tokens_per_hash = 16,
               .world_size = 1,
               .replicated_layout = false};
  OffloadConfig c = Bytes(40ull << 30);
  c.block_size = 256;
  auto geo = ComputeOffloadGeometry(c, g);
  ASSERT_TRUE(geo.ok()) << geo.status().ToString();
  EXPECT_EQ(geo->blocks_per_chunk, 16u);
  EXPECT_EQ(geo->tokens_per_chunk, 256u);
  EXPECT_EQ(geo->hashes_per_chunk, 16u);
  EXPECT_EQ(geo->num_copies, 1u);
  EXPECT_EQ(geo->kv_bytes_per_chunk, 33554432u);  // 32 MiB, already page-aligned
  EXPECT_EQ(geo->row_bytes, 33554432u);
  EXPECT_EQ(geo->num_blocks, 1280u);  // 40 GiB / 32 MiB
  EXPECT_EQ(geo->cpu_page_size_per_worker, 33554432u);
}

TEST(OffloadGeometryTest, TensorParallelRowsHoldEveryWorkerAndArePageAligned) {
  // vLLM's test_tiering_spec_aligns_row_size: 16 bytes per block per worker, 2 blocks per chunk,
  // world size 6 -> 192 bytes, one 4096-byte page per row; 3 pages of CPU -> 3 blocks.
  KvGeometry g{.worker_kv_bytes_per_block = 16,
               .gpu_block_size = 16,
               .tokens_per_hash = 16,
               .world_size = 6,
               .replicated_layout = false};
  OffloadConfig c = Bytes(4096 * 3);
  c.blocks_per_chunk = 2;
  auto geo = ComputeOffloadGeometry(c, g);
  ASSERT_TRUE(geo.ok()) << geo.status().ToString();
  EXPECT_EQ(geo->num_copies, 6u);
  EXPECT_EQ(geo->kv_bytes_per_chunk, 192u);
  EXPECT_EQ(geo->row_bytes, 4096u);
  EXPECT_EQ(geo->num_blocks, 3u);
  EXPECT_EQ(geo->cpu_page_size_per_worker, 32u);
  EXPECT_EQ(geo->tokens_per_chunk, 32u);
  EXPECT_EQ(geo->hashes_per_chunk, 2u);

  // The same with no alignment (page size 1): vLLM's test_cpu_spec_sizes_normalized_worker_layout.
  c.cpu_bytes_to_use = 1920;
  auto unaligned = ComputeOffloadGeometry(c, g, /*page_size=*/1);
  ASSERT_TRUE(unaligned.ok());
  EXPECT_EQ(unaligned->row_bytes, 192u);
  EXPECT_EQ(unaligned->num_blocks, 10u);
  // And aligned, 1920 bytes do not hold one 4096-byte row.
  EXPECT_EQ(ComputeOffloadGeometry(c, g)->num_blocks, 0u);
}

TEST(OffloadGeometryTest, ReplicatedLayoutKeepsOneCopy) {
  // vLLM's test_tiering_spec_replicated_sizing_removes_world_factor (world size 4).
  KvGeometry g{.worker_kv_bytes_per_block = 4096,
               .gpu_block_size = 64,
               .tokens_per_hash = 16,
               .world_size = 4,
               .replicated_layout = true};
  auto geo = ComputeOffloadGeometry(Bytes(4096 * 8), g);
  ASSERT_TRUE(geo.ok());
  EXPECT_EQ(geo->num_copies, 1u);
  EXPECT_EQ(geo->kv_bytes_per_chunk, 4096u);
  EXPECT_EQ(geo->cpu_page_size_per_worker, 4096u);
  EXPECT_EQ(geo->num_blocks, 8u);
  EXPECT_EQ(geo->blocks_per_chunk, 1u);
  EXPECT_EQ(geo->tokens_per_chunk, 64u);
  EXPECT_EQ(geo->hashes_per_chunk, 4u);  // 64-token blocks hashed every 16 tokens
}

TEST(OffloadGeometryTest, OddSizesRoundUpToThePage) {
  KvGeometry g{.worker_kv_bytes_per_block = 1000,
               .gpu_block_size = 16,
               .tokens_per_hash = 16,
               .world_size = 2,
               .replicated_layout = false};
  OffloadConfig c = Bytes(100000);
  c.blocks_per_chunk = 3;
  auto geo = ComputeOffloadGeometry(c, g);
  ASSERT_TRUE(geo.ok());
  EXPECT_EQ(geo->kv_bytes_per_chunk, 6000u);
  EXPECT_EQ(geo->row_bytes, 8192u);
  EXPECT_EQ(geo->num_blocks, 12u);  // 100000 / 8192
  EXPECT_EQ(geo->cpu_page_size_per_worker, 3000u);
  // A 64 KiB page (e.g. aarch64 with 64K pages).
  auto big = ComputeOffloadGeometry(c, g, 65536);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->row_bytes, 65536u);
  EXPECT_EQ(big->num_blocks, 1u);
}

TEST(OffloadGeometryTest, ZeroWorkerBytesGiveAnEmptyCache) {
  // vLLM's test_cpu_spec_zero_worker_bytes_produces_empty_cache.
  KvGeometry g{.worker_kv_bytes_per_block = 0,
               .gpu_block_size = 16,
               .tokens_per_hash = 16,
               .world_size = 4,
               .replicated_layout = false};
  auto geo = ComputeOffloadGeometry(Bytes(65536), g);
  ASSERT_TRUE(geo.ok());
  EXPECT_EQ(geo->kv_bytes_per_chunk, 0u);
  EXPECT_EQ(geo->cpu_page_size_per_worker, 0u);
  EXPECT_EQ(geo->num_blocks, 0u);
}

TEST(OffloadGeometryTest, Rejections) {
  KvGeometry g;
  g.worker_kv_bytes_per_block = 4096;
  // More CPU blocks than the policy's table holds (MaxPolicyBlocks): named, not an abort later.
  auto many = ComputeOffloadGeometry(Bytes((kMaxLruBlocks + 1) * 4096), g);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("holds 33554433 CPU blocks of 4096 bytes; at most "
                                         "33554432 with eviction_policy 'lru'"),
            std::string::npos)
      << many.status().message();
  auto most = ComputeOffloadGeometry(Bytes(kMaxLruBlocks * 4096), g);
  ASSERT_TRUE(most.ok()) << most.status().ToString();
  EXPECT_EQ(most->num_blocks, kMaxLruBlocks);
  OffloadConfig arc = Bytes((kMaxArcBlocks + 1) * 4096);
  arc.eviction_policy = "arc";
  auto many_arc = ComputeOffloadGeometry(arc, g);
  ASSERT_FALSE(many_arc.ok());
  EXPECT_NE(many_arc.status().message().find("at most 8388608 with eviction_policy 'arc'"),
            std::string::npos)
      << many_arc.status().message();

  OffloadConfig c = Bytes(1 << 30);
  c.block_size = 40;
  auto not_multiple = ComputeOffloadGeometry(c, g);
  ASSERT_FALSE(not_multiple.ok());
  EXPECT_NE(not_multiple.status().message().find("'block_size' 40"), std::string::npos);

  KvGeometry bad_hash = g;
  bad_hash.tokens_per_hash = 5;
  auto h = ComputeOffloadGeometry(Bytes(1 << 30), bad_hash);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("tokens_per_block=16 not divisible by tokens_per_hash=5"),
            std::string::npos)
      << h.status().message();

  KvGeometry zero_world = g;
  zero_world.world_size = 0;
  EXPECT_FALSE(ComputeOffloadGeometry(Bytes(1 << 30), zero_world).ok());
  KvGeometry zero_block = g;
  zero_block.gpu_block_size = 0;
  EXPECT_FALSE(ComputeOffloadGeometry(Bytes(1 << 30), zero_block).ok());
  EXPECT_FALSE(ComputeOffloadGeometry(Bytes(1 << 30), g, /*page_size=*/0).ok());

  KvGeometry huge = g;
  huge.worker_kv_bytes_per_block = 1ull << 62;
  huge.world_size = 8;
  auto overflow = ComputeOffloadGeometry(Bytes(1 << 30), huge);
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.status().message().find("overflows"), std::string::npos);
}

TEST(OffloadGeometryTest, ParseWithGeometryChecksTheGeometryToo) {
  KvGeometry bad;
  bad.tokens_per_hash = 0;
  EXPECT_FALSE(ParseOffloadConfig(WithBytes(""), bad).ok());
}

// ---- schemas/offload_config.schema.json ---------------------------------------------------------

std::filesystem::path SourceRoot() {
  if (const char* root = std::getenv("KVO_SOURCE_ROOT")) return root;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

nlohmann::json LoadSchema() {
  const std::filesystem::path path = SourceRoot() / "schemas" / "offload_config.schema.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json schema = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(schema.is_discarded()) << path << " is not valid JSON";
  return schema;
}

std::set<std::string> PropertyNames(const nlohmann::json& def) {
  std::set<std::string> names;
  for (const auto& [key, v] : def.at("properties").items()) names.insert(key);
  return names;
}

std::set<std::string> AsSet(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

TEST(OffloadConfigSchemaTest, IsJsonSchemaDraft2020) {
  nlohmann::json schema = LoadSchema();
  ASSERT_TRUE(schema.is_object());
  EXPECT_EQ(schema.value("$schema", ""), "https://json-schema.org/draft/2020-12/schema");
  ASSERT_TRUE(schema.contains("$defs"));
}

TEST(OffloadConfigSchemaTest, ListsEveryKeyTheParserReads) {
  nlohmann::json schema = LoadSchema();
  ASSERT_TRUE(schema.contains("$defs"));
  const nlohmann::json& defs = schema["$defs"];
  EXPECT_EQ(PropertyNames(defs.at("extra_config")), AsSet(OffloadConfigKeys()));
  EXPECT_EQ(PropertyNames(defs.at("fs_tier")), AsSet(FsTierConfigKeys()));
  EXPECT_EQ(PropertyNames(defs.at("kv_transfer_config")), AsSet(KvTransferConfigKeys()));
  // Every documented key has a description.
  for (const char* def : {"extra_config", "fs_tier", "kv_transfer_config"}) {
    for (const auto& [key, v] : defs.at(def).at("properties").items()) {
      if (key == "type") continue;
      EXPECT_TRUE(v.contains("description")) << def << "." << key;
    }
  }
}

TEST(OffloadConfigSchemaTest, DefaultsMatchTheParser) {
  nlohmann::json schema = LoadSchema();
  ASSERT_TRUE(schema.contains("$defs"));
  const nlohmann::json& extra = schema["$defs"]["extra_config"]["properties"];
  const OffloadConfig c = MustParse(WithBytes(""));
  EXPECT_EQ(extra["spec_name"]["default"], std::string(OffloadSpecName(c.spec)));
  EXPECT_EQ(extra["eviction_policy"]["default"], c.eviction_policy);
  EXPECT_EQ(extra["offload_prompt_only"]["default"], c.offload_prompt_only);
  EXPECT_EQ(extra["store_threshold"]["default"], c.store_threshold);
  EXPECT_EQ(extra["max_tracker_size"]["default"], c.max_tracker_size);
  EXPECT_EQ(extra["self_describing_kv_events"]["default"], c.self_describing_kv_events);
  EXPECT_EQ(extra["canonical_layout"]["default"], c.canonical_layout);
  EXPECT_TRUE(extra["secondary_tiers"]["default"].empty());
  EXPECT_EQ(extra["spec_name"]["enum"],
            nlohmann::json::array({"CPUOffloadingSpec", "TieringOffloadingSpec"}));
  EXPECT_EQ(schema["$defs"]["extra_config"]["required"],
            nlohmann::json::array({"cpu_bytes_to_use"}));

  const FsTierConfig fs =
      MustParse(Tiering(R"([{"type": "fs", "root_dir": "/d"}])")).secondary_tiers.at(0).fs;
  const nlohmann::json& tier = schema["$defs"]["fs_tier"]["properties"];
  EXPECT_EQ(tier["n_read_threads"]["default"], fs.n_read_threads);
  EXPECT_EQ(tier["n_write_threads"]["default"], fs.n_write_threads);
  EXPECT_EQ(tier["enable_kv_events"]["default"], fs.enable_kv_events);
  EXPECT_TRUE(tier["locality"]["default"].is_null());
  EXPECT_EQ(tier["max_bytes"]["default"], fs.max_bytes);
  EXPECT_EQ(tier["locality"]["enum"], nlohmann::json::array({nullptr, "LOCAL", "REMOTE"}));
}

TEST(OffloadConfigSchemaTest, EvictionPolicyExamplesAreSupported) {
  nlohmann::json schema = LoadSchema();
  ASSERT_TRUE(schema.contains("$defs"));
  const std::vector<std::string> supported = SupportedEvictionPolicies();
  for (const auto& p :
       schema["$defs"]["extra_config"]["properties"]["eviction_policy"]["examples"]) {
    EXPECT_NE(std::find(supported.begin(), supported.end(), p.get<std::string>()), supported.end())
        << p;
  }
}

// Issue 10 item 1: the error message dump()ed a 10^5-deep value and overflowed the stack.
TEST(OffloadConfigTest, RefusesDeepNestingInABoundedMessage) {
  ExpectRejected(
      "{\"cpu_bytes_to_use\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
      {"nested deeper than 64"});
}

}  // namespace
}  // namespace kvo
