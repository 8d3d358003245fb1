// The hash parity doctor against vLLM's own test vectors (vllm-compat.md A.7) and against events
// hashed with deliberately different settings: each wrong setting must be named as the cause.
#include "indexer/service/doctor.h"

#include <gtest/gtest.h>

#include <numeric>

#include "indexer/service/sources_config.h"

namespace kvo {
namespace {

HashParityConfig Config(HashAlgo algo, std::string seed, int64_t block_size) {
  HashParityConfig c;
  c.algo = algo;
  c.seed = std::move(seed);
  c.block_size = block_size;
  return c;
}

std::vector<int64_t> Tokens(size_t n, int64_t first = 1) {
  std::vector<int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A GPU store as an engine with these settings emits it: parent nil, one hash per block.
BlockStored EngineStore(HashAlgo algo, const std::string& seed, size_t block_size,
                        const std::vector<int64_t>& tokens, std::vector<Value> extra = {}) {
  BlockHashOptions o;
  o.algo = algo;
  o.none_hash = NoneHash(algo, seed);
  o.block_size = block_size;
  o.extra_keys = std::move(extra);
  auto digests = HashBlocks(tokens, o);
  EXPECT_TRUE(digests.ok()) << digests.status().ToString();
  BlockStored s;
  for (const std::string& d : *digests)
    s.block_hashes.push_back(BlockHash::Uint(BlockDigest::Low64(d)));
  s.token_ids = tokens;
  s.block_size = static_cast<int64_t>(block_size);
  s.medium = kMediumGpu;
  return s;
}

TEST(DoctorTest, AcceptsVllmTestVectors) {
  // A.7: PYTHONHASHSEED=0, blocks [1,2,3,4] and [5,6,7,8].
  BlockStored s;
  s.block_hashes = {BlockHash::Uint(10362225831949560093ull),
                    BlockHash::Uint(12472515041799373675ull)};
  s.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  s.block_size = 4;
  HashParityDoctor ok("vllm", Config(HashAlgo::kSha256, "0", 4));
  ok.CheckStored(s);
  ParityReport r = ok.report();
  EXPECT_EQ(r.state, ParityState::kOk);
  EXPECT_EQ(r.checked_blocks, 2u);
  EXPECT_EQ(r.matched_blocks, 2u);

  BlockStored cbor = s;
  cbor.block_hashes = {BlockHash::Uint(2164874634404590027ull),
                       BlockHash::Uint(17270480062156288726ull)};
  HashParityDoctor cbor_ok("vllm", Config(HashAlgo::kSha256Cbor, "0", 4));
  cbor_ok.CheckStored(cbor);
  EXPECT_EQ(cbor_ok.report().state, ParityState::kOk);

  // The CBOR engine checked as if it used the default sha256: the algorithm is named.
  HashParityDoctor wrong("vllm", Config(HashAlgo::kSha256, "0", 4));
  wrong.CheckStored(cbor);
  ParityReport w = wrong.report();
  EXPECT_EQ(w.state, ParityState::kMismatch);
  EXPECT_EQ(w.mismatched_blocks, 2u);
  EXPECT_EQ(w.cause, "algorithm");
  EXPECT_NE(w.detail.find("sha256_cbor"), std::string::npos) << w.detail;
  EXPECT_FALSE(w.example.empty());
}

TEST(DoctorTest, NamesTheSeed) {
  HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 16));
  d.CheckStored(EngineStore(HashAlgo::kSha256, "17", 16, Tokens(64)));
  ParityReport r = d.report();
  EXPECT_EQ(r.state, ParityState::kMismatch);
  EXPECT_EQ(r.cause, "seed");
  EXPECT_NE(r.detail.find("'17'"), std::string::npos) << r.detail;
}

TEST(DoctorTest, NamesAlgorithmAndSeedTogether) {
  HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 16));
  d.CheckStored(EngineStore(HashAlgo::kSha256Cbor, "5", 16, Tokens(32)));
  EXPECT_EQ(d.report().cause, "algorithm+seed");
}

TEST(DoctorTest, NamesTheBlockSizeBothWays) {
  // Engine hashes every 32 tokens; configured 16 (tokens per hash a multiple of it).
  HashParityDoctor coarse("e", Config(HashAlgo::kSha256, "0", 16));
  coarse.CheckStored(EngineStore(HashAlgo::kSha256, "0", 32, Tokens(64)));
  EXPECT_EQ(coarse.report().state, ParityState::kMismatch);
  EXPECT_EQ(coarse.report().cause, "block_size");
  // Engine hashes every 16; configured 32 (tokens per hash not a multiple).
  HashParityDoctor fine("e", Config(HashAlgo::kSha256, "0", 32));
  fine.CheckStored(EngineStore(HashAlgo::kSha256, "0", 16, Tokens(64)));
  EXPECT_EQ(fine.report().state, ParityState::kMismatch);
  EXPECT_EQ(fine.report().cause, "block_size");
  EXPECT_NE(fine.report().detail.find("every 16 tokens"), std::string::npos)
      << fine.report().detail;
}

// vLLM's Mamba-align events (vllm#44451): token_ids span the null blocks that block_hashes leave
// out. 2 hashes with 3 blocks' tokens is not a misconfiguration: unverifiable, the state stays ok.
// It used to be counted as a block-size mismatch (sticky; `kvo index doctor` exited 1).
TEST(DoctorTest, MambaAlignEventsAreUnverifiableNotMismatched) {
  HashParityDoctor d("hybrid", Config(HashAlgo::kSha256, "0", 16));
  d.CheckStored(EngineStore(HashAlgo::kSha256, "0", 16, Tokens(32)));
  ASSERT_EQ(d.report().state, ParityState::kOk);
  BlockStored aligned = EngineStore(HashAlgo::kSha256, "0", 16, Tokens(48));
  aligned.block_hashes.erase(aligned.block_hashes.begin() + 1);  // the skipped null block
  aligned.parent_block_hash.reset();
  d.CheckStored(aligned);
  ParityReport r = d.report();
  EXPECT_EQ(r.state, ParityState::kOk) << r.cause << ": " << r.detail;
  EXPECT_EQ(r.mismatched_blocks, 0u);
  EXPECT_EQ(r.unverifiable_blocks, 2u);
}

TEST(DoctorTest, NamesExtraKeys) {
  // The engine hashed with the LoRA name as extra key, but the event carries no extra keys.
  Value lora;
  lora.v = ValueArray{Value{std::string("sql-adapter")}};
  BlockStored s = EngineStore(HashAlgo::kSha256, "0", 16, Tokens(32), {lora, lora});
  s.lora_name = "sql-adapter";
  HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 16));
  d.CheckStored(s);
  EXPECT_EQ(d.report().state, ParityState::kMismatch);
  EXPECT_EQ(d.report().cause, "extra_keys");

  // With the extra keys on the event (as vLLM sends them), the same hashes verify.
  s.extra_keys = std::vector<Value>{lora, lora};
  HashParityDoctor ok("e", Config(HashAlgo::kSha256, "0", 16));
  ok.CheckStored(s);
  EXPECT_EQ(ok.report().state, ParityState::kOk);
}

TEST(DoctorTest, AcceptsVllmOffloadEventsOfLoraBlocks) {
  // A healthy engine offloading LoRA blocks: its self-describing CPU (and STORAGE) events carry
  // lora_name but no extra_keys (B.9), while the hashes include (lora_name,) (A.7).
  Value lora;
  lora.v = ValueArray{Value{std::string("sql-adapter")}};
  for (const char* medium : {kMediumCpu, kMediumStorage}) {
    BlockStored s = EngineStore(HashAlgo::kSha256, "0", 16, Tokens(32), {lora, lora});
    s.lora_name = "sql-adapter";
    s.medium = medium;
    HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 16));
    d.CheckStored(s);
    EXPECT_EQ(d.report().state, ParityState::kOk) << medium << ": " << d.report().cause;
    EXPECT_EQ(d.report().matched_blocks, 2u) << medium;
  }
  // The same offload event hashed without the LoRA name is still a mismatch, named.
  BlockStored plain = EngineStore(HashAlgo::kSha256, "0", 16, Tokens(32));
  plain.lora_name = "sql-adapter";
  plain.medium = kMediumCpu;
  HashParityDoctor bad("e", Config(HashAlgo::kSha256, "0", 16));
  bad.CheckStored(plain);
  EXPECT_EQ(bad.report().state, ParityState::kMismatch);
  EXPECT_EQ(bad.report().cause, "extra_keys");
}

TEST(DoctorTest, VerifiesChainedEventsThroughRememberedParents) {
  std::vector<int64_t> tokens = Tokens(64);
  BlockStored all = EngineStore(HashAlgo::kSha256, "0", 16, tokens);
  // The engine publishes the prefix in two steps: blocks 0-1, then 2-3 with parent block 1.
  BlockStored first = all;
  first.block_hashes.resize(2);
  first.token_ids.resize(32);
  BlockStored second;
  second.block_hashes = {all.block_hashes[2], all.block_hashes[3]};
  second.parent_block_hash = all.block_hashes[1];
  second.token_ids.assign(tokens.begin() + 32, tokens.end());
  second.block_size = 16;

  HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 16));
  d.CheckStored(second);  // parent not seen yet: cannot be verified, not a mismatch
  EXPECT_EQ(d.report().state, ParityState::kPending);
  EXPECT_EQ(d.report().unverifiable_blocks, 2u);
  d.CheckStored(first);
  d.CheckStored(second);
  ParityReport r = d.report();
  EXPECT_EQ(r.state, ParityState::kOk);
  EXPECT_EQ(r.checked_blocks, 4u);

  // A corrupted chained hash is caught.
  BlockStored bad = second;
  bad.block_hashes[1] = BlockHash::Uint(bad.block_hashes[1].value ^ 1);
  d.CheckStored(bad);
  EXPECT_EQ(d.report().state, ParityState::kMismatch);
  EXPECT_EQ(d.report().mismatched_blocks, 1u);
  EXPECT_EQ(d.report().cause, "extra_keys");  // a prefix of the event matched
}

TEST(DoctorTest, RawDigestHashesAndPlaceholders) {
  BlockHashOptions o;
  o.none_hash = NoneHash(HashAlgo::kSha256, "0");
  o.block_size = 4;
  auto digests = HashBlocks(Tokens(8), o);
  ASSERT_TRUE(digests.ok());
  BlockStored s;
  s.block_hashes = {BlockHash::Bytes((*digests)[0]), BlockHash::Bytes((*digests)[1])};
  s.token_ids = Tokens(8);
  s.block_size = 4;
  HashParityDoctor d("e", Config(HashAlgo::kSha256, "0", 4));
  d.CheckStored(s);
  EXPECT_EQ(d.report().state, ParityState::kOk);

  BlockStored placeholder;  // CPU offload without self-describing events
  placeholder.block_hashes = {BlockHash::Uint(1)};
  placeholder.medium = kMediumCpu;
  d.CheckStored(placeholder);
  EXPECT_EQ(d.report().unverifiable_blocks, 1u);
  EXPECT_EQ(d.report().state, ParityState::kOk);
}

TEST(DoctorTest, UnconfiguredChecksNothingAndMetricsFollowTheVerdict) {
  HashParityDoctor none("e", std::nullopt);
  EventBatch b;
  b.events.push_back(EngineStore(HashAlgo::kSha256, "0", 16, Tokens(16)));
  none.Check(b);
  EXPECT_EQ(none.report().state, ParityState::kUnconfigured);
  EXPECT_EQ(none.report().checked_blocks, 0u);

  MetricsRegistry reg;
  Counter* checked = *reg.AddCounter("checked", "");
  Counter* mismatched = *reg.AddCounter("mismatched", "");
  Gauge* state = *reg.AddGauge("state", "");
  HashParityDoctor d("e", Config(HashAlgo::kSha256, "1", 16));
  d.SetMetrics(checked, mismatched, state);
  d.Check(b);
  EXPECT_EQ(checked->Value(), 1);
  EXPECT_EQ(mismatched->Value(), 1);
  EXPECT_EQ(state->Value(), 1);
}

TEST(DoctorTest, XxhashEnginesAreCheckedAndNamed) {
  for (HashAlgo algo : {HashAlgo::kXxhash, HashAlgo::kXxhashCbor}) {
    SCOPED_TRACE(HashAlgoName(algo));
    HashParityDoctor ok("e", Config(algo, "3", 16));
    ok.CheckStored(EngineStore(algo, "3", 16, Tokens(48)));
    EXPECT_EQ(ok.report().state, ParityState::kOk);
    EXPECT_EQ(ok.report().matched_blocks, 3u);
    // An xxhash engine checked as sha256: the algorithm is named (the seed agrees).
    HashParityDoctor wrong("e", Config(HashAlgo::kSha256, "3", 16));
    wrong.CheckStored(EngineStore(algo, "3", 16, Tokens(32)));
    EXPECT_EQ(wrong.report().cause, "algorithm");
    EXPECT_NE(wrong.report().detail.find(std::string("hashes with ") + HashAlgoName(algo)),
              std::string::npos)
        << wrong.report().detail;
  }
}

// Current vLLM without PYTHONHASHSEED hashes sha256* from "vllm-none-hash": a source configured
// without a seed agrees; one configured with the old habit "0" is told the engine uses the default.
TEST(DoctorTest, FixedDefaultSeed) {
  const std::string def(kDefaultNoneHashSeed);
  HashParityDoctor ok("e", Config(HashAlgo::kSha256Cbor, def, 16));
  ok.CheckStored(EngineStore(HashAlgo::kSha256Cbor, def, 16, Tokens(32)));
  EXPECT_EQ(ok.report().state, ParityState::kOk);

  HashParityDoctor zero("e", Config(HashAlgo::kSha256, "0", 16));
  zero.CheckStored(EngineStore(HashAlgo::kSha256, def, 16, Tokens(32)));
  ParityReport r = zero.report();
  EXPECT_EQ(r.cause, "seed");
  EXPECT_NE(r.detail.find("fixed default seed 'vllm-none-hash'"), std::string::npos) << r.detail;
}

// An older vLLM (before the fixed default) without PYTHONHASHSEED: a random NONE_HASH per process.
// Configured without a seed (so kvo assumes "vllm-none-hash"), the doctor names the seed rule.
TEST(DoctorTest, NamesSeedUnsetOnAnOlderVllm) {
  const std::string random_seed =
      "9f2c4e0b7d1a3c5e8f6b2d4a0c9e7f1b3d5a7c9e1f3b5d7a9c2e4f6b8d0a2c4e";
  const std::string def(kDefaultNoneHashSeed);
  for (HashAlgo algo : {HashAlgo::kSha256, HashAlgo::kSha256Cbor}) {
    SCOPED_TRACE(HashAlgoName(algo));
    HashParityDoctor d("e", Config(algo, def, 16));
    // The engine sends raw digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): a store chained from
    // a known parent verifies whatever NONE_HASH is.
    BlockHashOptions o;
    o.algo = algo;
    o.none_hash = NoneHash(algo, random_seed);
    o.block_size = 16;
    auto chain = HashBlocks(Tokens(48), o);
    ASSERT_TRUE(chain.ok());
    BlockStored chained;
    chained.parent_block_hash = BlockHash::Bytes((*chain)[0]);
    chained.block_hashes = {BlockHash::Bytes((*chain)[1]), BlockHash::Bytes((*chain)[2])};
    chained.token_ids = Tokens(32, 17);
    chained.block_size = 16;
    d.CheckStored(chained);
    EXPECT_EQ(d.report().state, ParityState::kOk);
    // The first block of a prefix cannot be reproduced with any seed.
    BlockStored root;
    root.block_hashes = {BlockHash::Bytes((*chain)[0])};
    root.token_ids = Tokens(16);
    root.block_size = 16;
    d.CheckStored(root);
    ParityReport r = d.report();
    EXPECT_EQ(r.state, ParityState::kMismatch);
    EXPECT_EQ(r.cause, "seed");
    EXPECT_NE(r.detail.find("seed unset on a vLLM older than the fixed default"), std::string::npos)
        << r.detail;
    EXPECT_NE(r.detail.find("only NONE_HASH differs"), std::string::npos) << r.detail;
    EXPECT_NE(r.detail.find("PYTHONHASHSEED"), std::string::npos) << r.detail;
  }
  // The same engine against an explicitly configured seed: the seed rule is not the explanation.
  HashParityDoctor explicit_seed("e", Config(HashAlgo::kSha256, "0", 16));
  explicit_seed.CheckStored(EngineStore(HashAlgo::kSha256, random_seed, 16, Tokens(16)));
  EXPECT_EQ(explicit_seed.report().cause, "unknown");
  EXPECT_EQ(explicit_seed.report().detail.find("older than the fixed default:"), std::string::npos)
      << explicit_seed.report().detail;
}

// The indexer's source settings follow vLLM's seed rule: no seed is "vllm-none-hash" for the
// sha256 variants and an error naming the seed for the xxhash variants.
TEST(DoctorTest, SourceHashSettingsFollowTheSeedRule) {
  auto flag = ParseSourceFlag("e=tcp://127.0.0.1:5557,hash_algo=sha256_cbor");
  ASSERT_TRUE(flag.ok()) << flag.status().ToString();
  ASSERT_TRUE(flag->hash.has_value());
  EXPECT_EQ(flag->hash->seed, "vllm-none-hash");
  auto given = ParseSourceFlag("e=tcp://127.0.0.1:5557,hash_seed=0,hash_algo=xxhash");
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->hash->algo, HashAlgo::kXxhash);
  EXPECT_EQ(given->hash->seed, "0");
  auto missing = ParseSourceFlag("e=tcp://127.0.0.1:5557,hash_algo=xxhash_cbor,block_size=16");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("hash_seed"), std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("PYTHONHASHSEED"), std::string::npos);

  auto json = ParseIndexerConfig(
      R"({"db": "x.db", "sources": [{"name": "a", "endpoint": "tcp://127.0.0.1:5557",
          "hash": {"algo": "sha256"}}]})",
      "cfg.json");
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_EQ(json->sources[0].hash->seed, "vllm-none-hash");
  auto xx = ParseIndexerConfig(
      R"({"db": "x.db", "sources": [{"name": "a", "endpoint": "tcp://127.0.0.1:5557",
          "hash": {"algo": "xxhash", "block_size": 16}}]})",
      "cfg.json");
  ASSERT_FALSE(xx.ok());
  EXPECT_NE(xx.status().message().find("sources[0].hash.seed"), std::string::npos)
      << xx.status().message();
}

}  // namespace
}  // namespace kvo
