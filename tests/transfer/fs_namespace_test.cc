#include "transfer/fs_namespace.h"

#include <gtest/gtest.h>

namespace kvo {
namespace {

FsRunFields VllmTestVector() {
  FsRunFields f;
  f.model_name = "test-model";
  f.tokens_per_hash = 16;
  f.blocks_per_file = 1;
  f.dtype = "float16";
  return f;
}

// vllm-compat.md B.11 test vectors.
TEST(FsNamespaceTest, DigestMatchesVllmTestVector) {
  auto compact = FsFieldsCompactJson(VllmTestVector());
  ASSERT_TRUE(compact.ok());
  EXPECT_EQ(*compact,
            R"({"blocks_per_file":1,"dcp_size":1,"dtype":"float16","inference_engine":"vllm",)"
            R"("kv_cache_groups":[],"model_name":"test-model","parallel_agnostic":false,)"
            R"("pcp_size":1,"pp_size":1,"tokens_per_hash":16,"tp_size":1})");
  EXPECT_EQ(*FsNamespaceDigest(VllmTestVector()), "de3bba26cf36");
  EXPECT_EQ(*FsNamespaceName(VllmTestVector()), "test-model_de3bba26cf36");
}

TEST(FsNamespaceTest, BlockPathMatchesVllmTestVector) {
  auto key = FsBlockKeyFromDigest(std::string("\x00\x01\x02\x03\x04\x05\x06\x07", 8), 2);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->hex, "0001020304050607");
  EXPECT_EQ(FsBlockRelativePath("test-model_de3bba26cf36", 3, *key),
            "test-model_de3bba26cf36_r3/000/10_g2/0001020304050607.bin");
}

// Expected values computed with Python's json/hashlib exactly as vLLM's FileMapper does.
TEST(FsNamespaceTest, ConfigJsonAndDigestMatchPythonForARealModel) {
  FsRunFields f;
  f.model_name = "meta-llama/Llama-3.1-8B";
  f.blocks_per_file = 4;
  f.tp_size = 2;
  f.dtype = "bfloat16";
  f.kv_cache_groups = {{16, {"model.layers.0.self_attn", "model.layers.1.self_attn"}}};
  EXPECT_EQ(*FsNamespaceDigest(f), "90fdf7d6b3f9");
  EXPECT_EQ(*FsNamespaceName(f), "meta-llama_Llama-3.1-8B_90fdf7d6b3f9");
  EXPECT_EQ(*FsFieldsConfigJson(f),
            "{\n  \"blocks_per_file\": 4,\n  \"dcp_size\": 1,\n  \"dtype\": \"bfloat16\",\n  "
            "\"inference_engine\": \"vllm\",\n  \"kv_cache_groups\": [\n    {\n      "
            "\"layer_names\": [\n        \"model.layers.0.self_attn\",\n        "
            "\"model.layers.1.self_attn\"\n      ],\n      \"tokens_per_block\": 16\n    }\n  ],\n"
            "  \"model_name\": \"meta-llama/Llama-3.1-8B\",\n  \"parallel_agnostic\": false,\n  "
            "\"pcp_size\": 1,\n  \"pp_size\": 1,\n  \"tokens_per_hash\": 16,\n  \"tp_size\": 2\n}");
}

TEST(FsNamespaceTest, ParallelAgnosticAndNonAsciiFollowPython) {
  FsRunFields f = VllmTestVector();
  f.model_name = "m\xc3\xa9/x";
  f.parallel_agnostic = true;
  f.tp_size = 4;  // forced to 1
  f.replicated_layout = true;
  EXPECT_EQ(*FsFieldsCompactJson(f),
            R"({"blocks_per_file":1,"dcp_size":1,"dtype":"float16","inference_engine":"vllm",)"
            R"("kv_cache_groups":[],"model_name":"m\u00e9/x","pcp_size":1,"pp_size":1,)"
            R"("replicated_layout":true,"tokens_per_hash":16,"tp_size":1})");
  EXPECT_EQ(*FsNamespaceDigest(f), "aa0c8415df0b");
}

TEST(FsNamespaceTest, RejectsBadInput) {
  FsRunFields f = VllmTestVector();
  f.model_name = "";
  EXPECT_EQ(FsNamespaceDigest(f).status().code(), StatusCode::kInvalidArgument);
  f = VllmTestVector();
  f.canonical_format_json = "{not json";
  EXPECT_NE(FsNamespaceDigest(f).status().message().find("canonical_format"), std::string::npos);
  f.model_name = "..";
  f.canonical_format_json.reset();
  EXPECT_FALSE(FsNamespaceName(f).ok());

  for (const char* bad : {"", "abc", "0001", "00010203040506G7", "ABCDEF", "../../etc/passwd",
                          "0001020304050/", "000102030405060"}) {
    EXPECT_FALSE(ValidateBlockHex(bad).ok()) << bad;
    EXPECT_FALSE(MakeFsBlockKey(bad, 0).ok()) << bad;
  }
  EXPECT_TRUE(ValidateBlockHex("0001020304050607").ok());
  EXPECT_TRUE(ValidateBlockHex(std::string(64, 'f')).ok());
  EXPECT_FALSE(ValidateBlockHex(std::string(130, 'f')).ok());
}

TEST(FsNamespaceTest, ParsesNamesStrictly) {
  std::string ns;
  EXPECT_EQ(ParseRankDirName("test-model_de3bba26cf36_r3", &ns), 3u);
  EXPECT_EQ(ns, "test-model_de3bba26cf36");
  EXPECT_FALSE(ParseRankDirName("test-model_de3bba26cf36", nullptr));
  EXPECT_FALSE(ParseRankDirName("x_r03", nullptr));
  EXPECT_FALSE(ParseRankDirName("x_r-1", nullptr));
  EXPECT_TRUE(ParseDir1Name("0af"));
  EXPECT_FALSE(ParseDir1Name("0aF"));
  EXPECT_FALSE(ParseDir1Name("0a"));
  std::string two;
  EXPECT_EQ(ParseDir2Name("10_g2", &two), 2u);
  EXPECT_EQ(two, "10");
  EXPECT_FALSE(ParseDir2Name("10_g", nullptr));
  EXPECT_FALSE(ParseDir2Name("1x_g2", nullptr));
  EXPECT_FALSE(ParseDir2Name("10_g2x", nullptr));
  EXPECT_EQ(ParseBlockFileName("0001020304050607.bin"), "0001020304050607");
  EXPECT_FALSE(ParseBlockFileName("0001020304050607.bin_123.tmp"));
  EXPECT_FALSE(ParseBlockFileName("zz01020304050607.bin"));
}

}  // namespace
// Found by tests/fuzz/fs_names_fuzz: a rank or group of 10 digits (>= 10^9, still a u32) made a
// path the scan could not parse back, so such blocks were invisible to scans and recovery.
TEST(FsNamespaceTest, EveryU32RankAndGroupParsesBack) {
  std::string ns;
  EXPECT_EQ(ParseRankDirName("m_0123456789ab_r4294967295", &ns), 4294967295u);
  EXPECT_EQ(ns, "m_0123456789ab");
  EXPECT_EQ(ParseRankDirName("m_r1000000000", nullptr), 1000000000u);
  EXPECT_FALSE(ParseRankDirName("m_r4294967296", nullptr));  // beyond u32
  EXPECT_FALSE(ParseRankDirName("m_r10000000000", nullptr));
  std::string two;
  EXPECT_EQ(ParseDir2Name("ab_g4294967295", &two), 4294967295u);
  auto key = MakeFsBlockKey("abcdef0123", 4000000000u);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(ParseDir2Name(FsBlockDir2(*key), nullptr), 4000000000u);
}

// Found by tests/fuzz/fs_config_fuzz: a run field that is not UTF-8 (here a layer name) made
// nlohmann's dump() throw out of FsNamespaceName / FsFieldsConfigJson (std::terminate).
TEST(FsNamespaceTest, NonUtf8FieldsAreAnErrorNotAnException) {
  FsRunFields f;
  f.model_name = "meta-llama/Llama-3-8B";
  f.kv_cache_groups.push_back({16, {"layer.\xff\xee"}});
  auto name = FsNamespaceName(f);
  ASSERT_FALSE(name.ok());
  EXPECT_EQ(name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(name.status().message().find("UTF-8"), std::string::npos) << name.status().message();
  EXPECT_FALSE(FsFieldsConfigJson(f).ok());
  f.kv_cache_groups.clear();
  f.model_name = "model\xc3";  // a truncated sequence
  EXPECT_FALSE(FsFieldsCompactJson(f).ok());
}

}  // namespace kvo
