// vLLM block hashes (vllm-compat.md A.7): the published vectors, exact preimage bytes for pickle
// protocol 5 and canonical CBOR, errors, and a randomized comparison with Python itself
// (tests/events/hash_reference.py run by Debian's /usr/bin/python3 with python3-cbor2 and
// python3-xxhash), for all four --prefix-caching-hash-algo values and vLLM's NONE_HASH seed rule.
#include "events/block_hash.h"
#include "events/token_encode_internal.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

std::string Hex(std::string_view bytes) { return ToHex(bytes); }

std::string Unhex(std::string_view hex) {
  auto r = ParseHex(hex);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

Value Str(std::string s) { return Value{std::move(s)}; }
Value Int(int64_t i) { return Value{i}; }
Value Uint(uint64_t u) { return Value{u}; }
Value Bytes(std::string b) { return Value{Binary{std::move(b)}}; }
Value Tuple(ValueArray a) { return Value{std::move(a)}; }

// ----------------------------------------------------------------------------------------------
// A.7 test vectors (PYTHONHASHSEED=0, no extra keys).
constexpr char kSha256NoneHash[] =
    "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c";
constexpr char kCborNoneHash[] = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e";

TEST(BlockHashTest, ParseHashAlgo) {
  ASSERT_TRUE(ParseHashAlgo("sha256").ok());
  EXPECT_EQ(*ParseHashAlgo("sha256"), HashAlgo::kSha256);
  EXPECT_EQ(*ParseHashAlgo("sha256_cbor"), HashAlgo::kSha256Cbor);
  EXPECT_STREQ(HashAlgoName(HashAlgo::kSha256), "sha256");
  EXPECT_STREQ(HashAlgoName(HashAlgo::kSha256Cbor), "sha256_cbor");
  EXPECT_EQ(*ParseHashAlgo("xxhash"), HashAlgo::kXxhash);
  EXPECT_EQ(*ParseHashAlgo("xxhash_cbor"), HashAlgo::kXxhashCbor);
  for (HashAlgo algo : kAllHashAlgos) EXPECT_EQ(*ParseHashAlgo(HashAlgoName(algo)), algo);
  EXPECT_EQ(DigestSize(HashAlgo::kSha256), 32u);
  EXPECT_EQ(DigestSize(HashAlgo::kSha256Cbor), 32u);
  EXPECT_EQ(DigestSize(HashAlgo::kXxhash), 16u);
  EXPECT_EQ(DigestSize(HashAlgo::kXxhashCbor), 16u);
  for (const char* bad :
       {"", "SHA256", "xxh3", "xxhash128", "sha256-cbor", "md5", "sha256_msgpack"}) {
    auto r = ParseHashAlgo(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("xxhash_cbor"), std::string::npos) << r.status().message();
  }
}

// vLLM's resolve_none_hash_seed (#51875): PYTHONHASHSEED wins; unset, the sha256 variants use
// "vllm-none-hash" and the xxhash variants have no reproducible seed.
TEST(BlockHashTest, NoneHashSeedRule) {
  for (HashAlgo algo : kAllHashAlgos) {
    auto given = ResolveNoneHashSeed(algo, std::string("17"));
    ASSERT_TRUE(given.ok());
    EXPECT_EQ(*given, "17");
    auto empty = ResolveNoneHashSeed(algo, std::string());  // PYTHONHASHSEED="" is a seed too
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(*empty, "");
    auto unset = ResolveNoneHashSeed(algo, std::nullopt);
    if (IsCryptographic(algo)) {
      ASSERT_TRUE(unset.ok()) << HashAlgoName(algo);
      EXPECT_EQ(*unset, "vllm-none-hash");
    } else {
      ASSERT_FALSE(unset.ok()) << HashAlgoName(algo);
      EXPECT_EQ(unset.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(unset.status().message().find(HashAlgoName(algo)), std::string::npos);
      EXPECT_NE(unset.status().message().find("PYTHONHASHSEED"), std::string::npos);
    }
  }
  // The fixed-seed vectors (Python's pickle / cbor2 + hashlib; as in vllm-plugin.md).
  EXPECT_EQ(Hex(NoneHash(HashAlgo::kSha256, kDefaultNoneHashSeed)),
            "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198");
  EXPECT_EQ(Hex(NoneHash(HashAlgo::kSha256Cbor, kDefaultNoneHashSeed)),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
  const std::vector<int64_t> b0 = {1, 2, 3, 4};
  auto s =
      HashBlock(HashAlgo::kSha256, NoneHash(HashAlgo::kSha256, kDefaultNoneHashSeed), b0, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(BlockDigest::Low64(*s), 1882140585328457242ull);
  auto c = HashBlock(HashAlgo::kSha256Cbor, NoneHash(HashAlgo::kSha256Cbor, kDefaultNoneHashSeed),
                     b0, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(BlockDigest::Low64(*c), 9561501211280363793ull);
}

// Golden vectors for the xxhash variants, PYTHONHASHSEED=0, computed once with Debian's Python
// 3.11 (pickle protocol 5, cbor2 5.4) and python3-xxhash 3.2.0 / libxxhash 0.8.1:
//   xxhash.xxh3_128_digest(pickle.dumps(obj, 5)) and xxhash.xxh3_128_digest(cbor2.dumps(obj,
//   canonical=True)). MatchesPythonReference recomputes them on random inputs every run.
TEST(BlockHashTest, XxhashVectors) {
  struct Vec {
    HashAlgo algo;
    const char* none_hash;
    const char* h0;
    uint64_t w0;
    const char* h1;
    uint64_t w1;
    const char* preimage0;
  };
  const Vec vecs[] = {
      {HashAlgo::kXxhash, "6fb31cc38bba6066183f7f2104b9c051", "f3856cedd7e636094750c4546e855397",
       5138823041740264343ull, "0c9832567b17003b126077f57e0bb670", 1324190186712315504ull,
       "800595220000000000000043106fb31cc38bba6066183f7f2104b9c05194284b014b024b034b0474944e87942"
       "e"},
      {HashAlgo::kXxhashCbor, "1ebe36576dcb573f26b99533a20aaeca",
       "0a8577df5ee3430515a8cc1f6e3ac52e", 1560721706249274670ull,
       "d152782cb4d753bde718a811a3b75e23", 16652244415917022755ull,
       "83501ebe36576dcb573f26b99533a20aaeca8401020304f6"},
  };
  for (const Vec& v : vecs) {
    SCOPED_TRACE(HashAlgoName(v.algo));
    const std::string none = NoneHash(v.algo, "0");
    EXPECT_EQ(Hex(none), v.none_hash);
    BlockHasher h(v.algo);
    auto h0 = h.Hash(none, std::vector<int64_t>{1, 2, 3, 4}, nullptr);
    ASSERT_TRUE(h0.ok());
    EXPECT_EQ(Hex(h.LastPreimage()), v.preimage0);
    EXPECT_EQ(Hex(*h0), v.h0);
    EXPECT_EQ(BlockDigest::Low64(*h0), v.w0);
    auto h1 = h.Hash(*h0, std::vector<int64_t>{5, 6, 7, 8}, nullptr);
    ASSERT_TRUE(h1.ok());
    EXPECT_EQ(Hex(*h1), v.h1);
    EXPECT_EQ(BlockDigest::Low64(*h1), v.w1);
  }
}

TEST(BlockHashTest, Sha256Vectors) {
  const std::string none = NoneHash(HashAlgo::kSha256, "0");
  EXPECT_EQ(Hex(none), kSha256NoneHash);
  const std::vector<int64_t> b0 = {1, 2, 3, 4};
  const std::vector<int64_t> b1 = {5, 6, 7, 8};
  auto h0 = HashBlock(HashAlgo::kSha256, none, b0, nullptr);
  ASSERT_TRUE(h0.ok()) << h0.status().ToString();
  EXPECT_EQ(Hex(*h0).substr(0, 8), "762b2e7e");
  EXPECT_EQ(Hex(*h0).substr(56), "23bae91d");
  EXPECT_EQ(Hex(*h0), "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d");
  EXPECT_EQ(BlockDigest::Low64(*h0), 10362225831949560093ull);
  auto h1 = HashBlock(HashAlgo::kSha256, *h0, b1, nullptr);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(Hex(*h1).substr(0, 8), "9e62b5a7");
  EXPECT_EQ(Hex(*h1).substr(56), "2a2b036b");
  EXPECT_EQ(BlockDigest::Low64(*h1), 12472515041799373675ull);
}

TEST(BlockHashTest, Sha256CborVectors) {
  const std::string none = NoneHash(HashAlgo::kSha256Cbor, "0");
  EXPECT_EQ(Hex(none), kCborNoneHash);
  const std::vector<int64_t> b0 = {1, 2, 3, 4};
  const std::vector<int64_t> b1 = {5, 6, 7, 8};
  auto h0 = HashBlock(HashAlgo::kSha256Cbor, none, b0, nullptr);
  ASSERT_TRUE(h0.ok()) << h0.status().ToString();
  EXPECT_EQ(Hex(*h0).substr(0, 8), "c9d58ba6");
  EXPECT_EQ(Hex(*h0).substr(56), "8ef071cb");
  EXPECT_EQ(BlockDigest::Low64(*h0), 2164874634404590027ull);
  auto h1 = HashBlock(HashAlgo::kSha256Cbor, *h0, b1, nullptr);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(Hex(*h1).substr(0, 8), "24125b23");
  EXPECT_EQ(Hex(*h1).substr(56), "154ab2d6");
  EXPECT_EQ(BlockDigest::Low64(*h1), 17270480062156288726ull);
}

TEST(BlockHashTest, HashBlocksChainsFullBlocksOnly) {
  for (HashAlgo algo : {HashAlgo::kSha256, HashAlgo::kSha256Cbor}) {
    BlockHashOptions options;
    options.algo = algo;
    options.none_hash = NoneHash(algo, "0");
    options.block_size = 4;
    const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full + 1 partial
    auto hashes = HashBlocks(tokens, options);
    ASSERT_TRUE(hashes.ok()) << hashes.status().ToString();
    ASSERT_EQ(hashes->size(), 2u);
    EXPECT_EQ(BlockDigest::Low64((*hashes)[0]),
              algo == HashAlgo::kSha256 ? 10362225831949560093ull : 2164874634404590027ull);
    EXPECT_EQ(BlockDigest::Low64((*hashes)[1]),
              algo == HashAlgo::kSha256 ? 12472515041799373675ull : 17270480062156288726ull);
    // Nil extra keys, and entries past the last full block, change nothing.
    options.extra_keys = {Value{}, Value{}, Tuple({Str("ignored")})};
    auto again = HashBlocks(tokens, options);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *hashes);
    // Extra keys on block 0 change block 0 and, through the chain, block 1.
    options.extra_keys = {Tuple({Str("lora")})};
    auto salted = HashBlocks(tokens, options);
    ASSERT_TRUE(salted.ok());
    EXPECT_NE((*salted)[0], (*hashes)[0]);
    EXPECT_NE((*salted)[1], (*hashes)[1]);
  }
}

TEST(BlockHashTest, HashBlocksWireEqualsTheDigestChain) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 16 * 40 + 5; ++i) tokens.push_back((i * 7919) % 152000 - (i % 5 == 0));
  tokens[3] = std::numeric_limits<int64_t>::max();  // the slow paths too
  tokens[20] = int64_t{1} << 33;
  for (HashAlgo algo : kAllHashAlgos) {
    BlockHashOptions options;
    options.algo = algo;
    options.none_hash = NoneHash(algo, "7");
    options.block_size = 16;
    options.extra_keys = {Value{}, Tuple({Str("lora")})};
    auto digests = HashBlocks(tokens, options);
    auto wire = HashBlocksWire(tokens, options);
    ASSERT_TRUE(digests.ok() && wire.ok()) << HashAlgoName(algo);
    ASSERT_EQ(wire->size(), 40u);
    ASSERT_EQ(digests->size(), 40u);
    for (size_t i = 0; i < 40; ++i) {
      EXPECT_EQ((*wire)[i], BlockDigest::Low64((*digests)[i]))
          << HashAlgoName(algo) << " block " << i;
      EXPECT_EQ((*digests)[i].size(), DigestSize(algo));
    }
    options.block_size = 0;
    EXPECT_FALSE(HashBlocksWire(tokens, options).ok());
  }
}

// The fast paths (the one-pass pickle / CBOR of the common block and HashBlocksWire's chain, with
// the scalar token encoders and, where the CPU has it, the vector one) against the general pickler
// and CBOR writer, on random chains: every int width and sign (runs of eight tokens in one width
// too, the vector encoder's groups), block sizes with the TUPLE1-3 and EMPTY_TUPLE forms and past
// the fast writers' limit, seeds of other sizes. Same digests, wire hashes and preimages byte for
// byte. Seed printed.
TEST(BlockHashTest, FastPathsEqualTheGeneralPickler) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("FastPathsEqualTheGeneralPickler seed %u\n", seed);
  std::mt19937_64 rng(seed);
  auto token = [&]() -> int64_t {
    switch (rng() % 10) {
      case 0:
        return static_cast<int64_t>(rng() % 256);  // BININT1
      case 1:
        return 256 + static_cast<int64_t>(rng() % 65280);  // BININT2
      case 2:
        return static_cast<int64_t>(rng() % (uint64_t{INT32_MAX} + 1));  // BININT
      case 3:
        return -static_cast<int64_t>(rng() % 100000) - 1;  // negative: BININT
      case 4:
        return static_cast<int64_t>(rng());  // LONG1, either sign
      case 5: {
        static constexpr int64_t kEdges[] = {
            0,         255,       256,       65535, 65536, INT32_MAX, INT64_C(2147483648),
            INT32_MIN, INT64_MAX, INT64_MIN, -1};
        return kEdges[rng() % std::size(kEdges)];
      }
      default:
        return static_cast<int64_t>(rng() % 152000);  // a vocabulary's ids
    }
  };
  std::printf("vector token encoder on this CPU: %s\n",
              token_encode::VectorAvailable() ? "yes" : "no (scalar paths only)");
  for (int round = 0; round < 600; ++round) {
    const HashAlgo algo = kAllHashAlgos[static_cast<size_t>(round) % std::size(kAllHashAlgos)];
    BlockHashOptions fast;
    fast.algo = algo;
    fast.vector_encoder = (round / 4) % 2 == 0;
    const size_t sizes[] = {1, 2, 3, 4, 8, 16, 16, 16, 17, 24, 64, 6001};
    fast.block_size = sizes[rng() % std::size(sizes)];
    if (rng() % 4 == 0) {
      fast.none_hash = std::string(2 + rng() % 254, '\0');  // a seed digest of another size
      for (char& c : fast.none_hash) c = static_cast<char>(rng());
    } else {
      fast.none_hash = NoneHash(algo, std::to_string(rng() % 1000));
    }
    std::vector<int64_t> tokens(fast.block_size * (rng() % 12) + rng() % 3);
    const bool runs = rng() % 2 == 0;  // runs of 8 from one class, as a vector group sees them
    int64_t from_class = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (runs && i % 8 == 0) from_class = token();
      tokens[i] =
          runs ? from_class + static_cast<int64_t>(i % 8) * (from_class > 0 ? -1 : 1) : token();
    }
    BlockHashOptions general = fast;
    general.general_path_only = true;
    auto fast_wire = HashBlocksWire(tokens, fast);
    auto general_wire = HashBlocksWire(tokens, general);
    auto fast_digests = HashBlocks(tokens, fast);
    auto general_digests = HashBlocks(tokens, general);
    ASSERT_TRUE(fast_wire.ok() && general_wire.ok() && fast_digests.ok() && general_digests.ok());
    ASSERT_EQ(*fast_wire, *general_wire) << HashAlgoName(algo) << " block size " << fast.block_size
                                         << " vector " << fast.vector_encoder << " round " << round;
    ASSERT_EQ(*fast_digests, *general_digests) << HashAlgoName(algo) << " round " << round;
    // And the preimages themselves, block by block.
    BlockHasher f(algo);
    f.set_vector_encoder(fast.vector_encoder);
    BlockHasher g(algo);
    g.set_general_path_only(true);
    std::string parent = fast.none_hash;
    for (size_t i = 0; i + fast.block_size <= tokens.size(); i += fast.block_size) {
      const std::span<const int64_t> block(tokens.data() + i, fast.block_size);
      auto a = f.Hash(parent, block, nullptr);
      auto b = g.Hash(parent, block, nullptr);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(f.LastPreimage(), g.LastPreimage()) << "round " << round << " block at " << i;
      ASSERT_EQ(*a, *b);
      parent = *a;
    }
  }
}

TEST(BlockHashTest, HashBlocksRejectsBadOptions) {
  BlockHashOptions options;
  options.none_hash = NoneHash(HashAlgo::kSha256, "0");
  options.block_size = 0;
  const std::vector<int64_t> tokens = {1, 2};
  auto r = HashBlocks(tokens, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("block_size"), std::string::npos);
  options.block_size = 1;
  options.none_hash.clear();
  EXPECT_FALSE(HashBlocks(tokens, options).ok());
  // Fewer tokens than a block: no hashes, no error.
  options.none_hash = NoneHash(HashAlgo::kSha256, "0");
  options.block_size = 16;
  auto none = HashBlocks(tokens, options);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// ----------------------------------------------------------------------------------------------
// Exact preimages (expected bytes produced by CPython 3.11 pickle / cbor2).
std::string Parent32() {
  std::string p;
  for (int i = 0; i < 32; ++i) p.push_back(static_cast<char>(i));
  return p;
}

TEST(BlockHashTest, PicklePreimages) {
  BlockHasher h(HashAlgo::kSha256);
  (void)h.HashString("0");
  EXPECT_EQ(Hex(h.LastPreimage()), "80059505000000000000008c0130942e");

  const std::string none = Unhex(kSha256NoneHash);
  const std::vector<int64_t> b0 = {1, 2, 3, 4};
  ASSERT_TRUE(h.Hash(none, b0, nullptr).ok());
  EXPECT_EQ(Hex(h.LastPreimage()),
            std::string("800595320000000000000043201973e23848344dc43a988a9b478663803cfffe1243480253"
                        "f9a3cf004b14aa7c94284b014b024b034b0474944e87942e"));

  // BININT1/BININT2/BININT/LONG1 boundaries, negative ints.
  const std::vector<int64_t> ints = {0,
                                     255,
                                     256,
                                     65535,
                                     65536,
                                     2147483647,
                                     2147483648,
                                     -1,
                                     -2147483648LL,
                                     -2147483649LL,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
  ASSERT_TRUE(h.Hash(Parent32(), ints, nullptr).ok());
  EXPECT_EQ(Hex(h.LastPreimage()),
            std::string("8005956a000000000000004320000102030405060708090a0b0c0d0e0f101112131415161"
                        "718191a1b1c1d1e1f94284b004bff4d00014dffff4a000001004affffff7f8a0500000080"
                        "004affffffff4a000000808a05ffffff7fff8a08ffffffffffffff7f8a080000000000000"
                        "08074944e87942e"));

  // TUPLE2 tokens and an empty extra-keys tuple (EMPTY_TUPLE, never memoized).
  const std::vector<int64_t> two = {1, 2};
  const Value empty = Tuple({});
  ASSERT_TRUE(h.Hash(Parent32(), two, &empty).ok());
  EXPECT_EQ(Hex(h.LastPreimage()),
            "8005952d000000000000004320000102030405060708090a0b0c0d0e0f101112131415161718191a1b"
            "1c1d1e1f944b014b0286942987942e");

  // Memo: '' / 1-char latin-1 strs and b'' / 1-byte bytes are CPython singletons (a repeat is a
  // BINGET); longer ones are distinct objects; a uint64 above 2^63 is a 9-byte LONG1.
  const Value keys =
      Tuple({Str("a"), Str("a"), Str("ab"), Str("ab"), Str("\xc3\xa9"), Str("\xc3\xa9"),
             Str("\xe2\x82\xac"), Str("\xe2\x82\xac"), Tuple({Str("mm"), Int(3)}), Bytes(""),
             Bytes(""), Bytes("\xff"), Bytes("\xff"), Bytes("\xff\xff"), Bytes("\xff\xff"),
             Uint(std::numeric_limits<uint64_t>::max())});
  const std::vector<int64_t> seven = {7};
  ASSERT_TRUE(h.Hash(Parent32(), seven, &keys).ok());
  EXPECT_EQ(Hex(h.LastPreimage()),
            std::string("80059579000000000000004320000102030405060708090a0b0c0d0e0f101112131415161"
                        "718191a1b1c1d1e1f944b078594288c01619468028c026162948c026162948c02c3a99468"
                        "058c03e282ac948c03e282ac948c026d6d944b038694430094680a4301ff94680b4302ffff"
                        "944302ffff948a09ffffffffffffffff00749487942e"));
}

TEST(BlockHashTest, CborPreimages) {
  BlockHasher h(HashAlgo::kSha256Cbor);
  (void)h.HashString("0");
  EXPECT_EQ(Hex(h.LastPreimage()), "6130");

  const std::string none = Unhex(kCborNoneHash);
  const std::vector<int64_t> b0 = {1, 2, 3, 4};
  ASSERT_TRUE(h.Hash(none, b0, nullptr).ok());
  EXPECT_EQ(Hex(h.LastPreimage()), "835820" + std::string(kCborNoneHash) + "8401020304f6");

  const std::vector<int64_t> ints = {0,
                                     23,
                                     24,
                                     255,
                                     256,
                                     65535,
                                     65536,
                                     4294967295LL,
                                     4294967296LL,
                                     -1,
                                     -24,
                                     -25,
                                     -256,
                                     -257,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
  const Value keys = Tuple({Str("a"), Bytes(std::string(1, '\0')), Tuple({Str("mm"), Int(3)}),
                            Uint(std::numeric_limits<uint64_t>::max()), Tuple({})});
  ASSERT_TRUE(h.Hash(Parent32(), ints, &keys).ok());
  EXPECT_EQ(Hex(h.LastPreimage()),
            std::string("835820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f9000"
                        "17181818ff19010019ffff1a000100001affffffff1b00000001000000002037381838ff39"
                        "01001b7fffffffffffffff3b7fffffffffffffff856161410082626d6d031bffffffffffff"
                        "ffff80"));

  std::vector<int64_t> r24(24);
  for (int i = 0; i < 24; ++i) r24[i] = i;
  ASSERT_TRUE(h.Hash("", r24, nullptr).ok());
  EXPECT_EQ(Hex(h.LastPreimage()), "83409818000102030405060708090a0b0c0d0e0f1011121314151617f6");
}

TEST(BlockHashTest, HasherReuseMatchesFreshHasher) {
  for (HashAlgo algo : kAllHashAlgos) {
    BlockHasher reused(algo);
    std::vector<int64_t> big(20000, int64_t{1} << 40);  // several pickle frames
    const Value keys = Tuple({Str("x"), Str("x")});
    ASSERT_TRUE(reused.Hash(Parent32(), big, &keys).ok());
    const std::vector<int64_t> small = {1, 2, 3};
    auto a = reused.Hash(Parent32(), small, nullptr);
    auto b = HashBlock(algo, Parent32(), small, nullptr);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    EXPECT_EQ(reused.HashString("0"), NoneHash(algo, "0"));
  }
}

TEST(BlockHashTest, RejectsUnsupportedExtraKeys) {
  const std::vector<int64_t> tokens = {1};
  struct Bad {
    Value keys;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {Tuple({Value{true}}), "bool"},      {Tuple({Value{1.5}}), "float"},
      {Tuple({Value{}}), "None"},          {Tuple({Str("ok"), Tuple({Value{false}})}), "bool"},
      {Tuple({Str("\xff\xfe")}), "UTF-8"}, {Tuple({Str("\xed\xa0\x80")}), "UTF-8"},  // a surrogate
      {Str("not-a-tuple"), "a str"},       {Int(3), "an int"},
  };
  for (HashAlgo algo : {HashAlgo::kSha256, HashAlgo::kSha256Cbor}) {
    for (const Bad& b : bad) {
      auto r = HashBlock(algo, Parent32(), tokens, &b.keys);
      ASSERT_FALSE(r.ok()) << b.needle;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find(b.needle), std::string::npos) << r.status().message();
    }
    // Nesting is bounded.
    Value deep = Tuple({Int(1)});
    for (int i = 0; i < 100; ++i) deep = Tuple({deep});
    auto r = HashBlock(algo, Parent32(), tokens, &deep);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("nested"), std::string::npos);
    // The block index is named by HashBlocks.
    BlockHashOptions options;
    options.algo = algo;
    options.none_hash = NoneHash(algo, "0");
    options.block_size = 1;
    options.extra_keys = {Value{}, Tuple({Value{2.5}})};
    const std::vector<int64_t> two = {1, 2};
    auto hb = HashBlocks(two, options);
    ASSERT_FALSE(hb.ok());
    EXPECT_NE(hb.status().message().find("block 1"), std::string::npos) << hb.status().message();
  }
}

TEST(BlockHashTest, WireHashAndHex) {
  std::string d(32, '\0');
  for (int i = 0; i < 32; ++i) d[i] = static_cast<char>(i);
  EXPECT_EQ(BlockDigest::Low64(d), 0x18191a1b1c1d1e1full);
  EXPECT_EQ(BlockDigest::Low64(std::string("\x01\x02", 2)), 0x0102u);
  EXPECT_EQ(BlockDigest::Low64(""), 0u);
  EXPECT_EQ(ToHex(std::string("\x00\xab\xff", 3)), "00abff");
  auto p = ParseHex("00ABff");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, std::string("\x00\xab\xff", 3));
  EXPECT_FALSE(ParseHex("abc").ok());
  auto bad = ParseHex("zz");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'zz'"), std::string::npos);
}

// ----------------------------------------------------------------------------------------------
// Randomized comparison with Python.

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through
    }
  }
  return out + "\"";
}

std::string ValueJson(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v.v)) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return std::to_string(*u);
  if (const auto* s = std::get_if<std::string>(&v.v)) return JsonString(*s);
  if (const auto* b = std::get_if<Binary>(&v.v)) return "{\"bytes\":\"" + ToHex(b->data) + "\"}";
  if (v.is_nil()) return "null";
  const auto& a = std::get<ValueArray>(v.v);
  std::string out = "[";
  for (size_t i = 0; i < a.size(); ++i) out += (i ? "," : "") + ValueJson(a[i]);
  return out + "]";
}

struct Case {
  HashAlgo algo = HashAlgo::kSha256;
  std::optional<std::string> seed;  // nullopt: PYTHONHASHSEED unset (vLLM's default rule)
  size_t block_size = 1;
  std::vector<int64_t> tokens;
  std::vector<Value> extra_keys;
};

std::string CaseJson(const Case& c) {
  std::string out = "{\"algo\":\"" + std::string(HashAlgoName(c.algo)) +
                    "\",\"seed\":" + (c.seed ? JsonString(*c.seed) : std::string("null")) +
                    ",\"block_size\":" + std::to_string(c.block_size) + ",\"tokens\":[";
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(c.tokens[i]);
  }
  out += "],\"extra_keys\":[";
  for (size_t i = 0; i < c.extra_keys.size(); ++i) {
    if (i) out += ',';
    out += ValueJson(c.extra_keys[i]);
  }
  return out + "]}";
}

// Runs the Python reference over `cases`; one line of space-separated hex per case.
std::vector<std::string> RunPython(const std::vector<Case>& cases, const std::string& dir,
                                   bool preimage) {
  const std::string path = dir + "/cases.json";
  {
    std::ofstream f(path);
    f << "{\"cases\":[\n";
    for (size_t i = 0; i < cases.size(); ++i) f << (i ? ",\n" : "") << CaseJson(cases[i]);
    f << "\n]}\n";
    EXPECT_TRUE(f.good()) << path;
  }
  const char* root_env = std::getenv("KVO_SOURCE_ROOT");
  const std::string root = root_env != nullptr ? root_env : ".";
  const std::string script = root + "/tests/events/hash_reference.py";
  const std::string cmd = std::string(kPython) + " " + script + " " + path +
                          (preimage ? " --preimage" : "") + " 2>" + dir + "/stderr.txt";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return {};
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int rc = ::pclose(pipe);
  if (rc != 0) {
    std::ifstream err(dir + "/stderr.txt");
    std::stringstream ss;
    ss << err.rdbuf();
    ADD_FAILURE()
        << "the Python reference failed (exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1)
        << "): " << cmd << "\n"
        << ss.str()
        << "\nCI needs Debian's python3 with python3-cbor2 and python3-xxhash (apt install "
           "python3-cbor2 python3-xxhash).";
    return {};
  }
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// Our hex digests for a case: NONE_HASH then every full block (or the preimages).
Result<std::vector<std::string>> OurHashes(const Case& c, bool preimage) {
  BlockHasher hasher(c.algo);
  std::vector<std::string> out;
  auto seed = ResolveNoneHashSeed(c.algo, c.seed);
  if (!seed.ok()) return std::vector<std::string>{"error:", "seed", "required"};
  std::string parent = hasher.HashString(*seed);
  out.push_back(ToHex(preimage ? hasher.LastPreimage() : parent));
  for (size_t i = 0; i + 1 <= c.tokens.size() / c.block_size; ++i) {
    const Value* extra = i < c.extra_keys.size() ? &c.extra_keys[i] : nullptr;
    auto d =
        hasher.Hash(parent, std::span(c.tokens).subspan(i * c.block_size, c.block_size), extra);
    if (!d.ok()) return d.status();
    parent = *d;
    out.push_back(ToHex(preimage ? hasher.LastPreimage() : parent));
  }
  // The library's own chain must agree with the hand-rolled one above.
  if (!preimage) {
    BlockHashOptions options;
    options.algo = c.algo;
    options.none_hash = NoneHash(c.algo, *seed);
    options.block_size = c.block_size;
    options.extra_keys = c.extra_keys;
    auto chain = HashBlocks(c.tokens, options);
    if (!chain.ok()) return chain.status();
    for (size_t i = 0; i < chain->size(); ++i) {
      if (ToHex((*chain)[i]) != out[i + 1]) return Status::Internal("HashBlocks disagrees");
    }
  }
  return out;
}

class Generator {
 public:
  explicit Generator(unsigned seed) : rng_(seed) {}

  size_t Uniform(size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  int64_t Token(int mode) {
    static constexpr int64_t kBoundaries[] = {0,
                                              1,
                                              23,
                                              24,
                                              255,
                                              256,
                                              65535,
                                              65536,
                                              (int64_t{1} << 24),
                                              (int64_t{1} << 31) - 1,
                                              (int64_t{1} << 31),
                                              (int64_t{1} << 32) - 1,
                                              (int64_t{1} << 32),
                                              (int64_t{1} << 39),
                                              (int64_t{1} << 40) - 1,
                                              (int64_t{1} << 55),
                                              (int64_t{1} << 56) - 1,
                                              std::numeric_limits<int64_t>::max() - 1,
                                              std::numeric_limits<int64_t>::max()};
    static constexpr int64_t kNegative[] = {-1,
                                            -24,
                                            -25,
                                            -128,
                                            -129,
                                            -256,
                                            -257,
                                            -65536,
                                            -65537,
                                            -(int64_t{1} << 31),
                                            -(int64_t{1} << 31) - 1,
                                            -(int64_t{1} << 32),
                                            -(int64_t{1} << 39),
                                            -(int64_t{1} << 39) - 1,
                                            std::numeric_limits<int64_t>::min() + 1,
                                            std::numeric_limits<int64_t>::min()};
    switch (mode) {
      case 0:  // a tokenizer vocabulary
        return static_cast<int64_t>(Uniform(0, 151935));
      case 1:  // BININT1 range
        return static_cast<int64_t>(Uniform(0, 255));
      case 2:  // boundaries
        return kBoundaries[Uniform(0, std::size(kBoundaries) - 1)];
      case 3: {  // anywhere in 0..2^63-1, with a random bit length
        const auto bits = Uniform(1, 63);
        return static_cast<int64_t>(rng_() >> (64 - bits));
      }
      default: {  // everything, negatives included
        const size_t pick = Uniform(0, 3);
        if (pick == 0) return kNegative[Uniform(0, std::size(kNegative) - 1)];
        if (pick == 1) return static_cast<int64_t>(rng_());
        return Token(static_cast<int>(Uniform(0, 3)));
      }
    }
  }

  std::string RandomStr(size_t max_len) {
    static constexpr const char* kPieces[] = {"a",
                                              "Z",
                                              "0",
                                              " ",
                                              "\"",
                                              "\\",
                                              "\n",
                                              "\x01",
                                              "\xc3\xa9",      // é (latin-1: a CPython singleton)
                                              "\xc2\xa0",      // NBSP
                                              "\xe2\x82\xac",  // €
                                              "\xf0\x9f\x98\x80",  // 😀
                                              "mm-",
                                              "lora",
                                              "salt"};
    const size_t n = Uniform(0, max_len);
    std::string s;
    for (size_t i = 0; i < n; ++i) s += kPieces[Uniform(0, std::size(kPieces) - 1)];
    return s;
  }

  std::optional<std::string> Seed() {
    switch (Uniform(0, 6)) {
      case 6:
        return std::nullopt;  // unset: "vllm-none-hash" for sha256*, an error for xxhash*
      case 0:
        return "0";
      case 1:
        return std::to_string(Uniform(0, 4294967295u));
      case 2:
        return "random";
      case 3:
        return "";
      case 4:
        return RandomStr(Chance(0.2) ? 200 : 8);
      default: {
        std::string s;
        for (size_t i = 0, n = Uniform(1, 40); i < n; ++i)
          s += static_cast<char>('0' + Uniform(0, 9));
        return s;
      }
    }
  }

  std::string RandomBytes() {
    static constexpr size_t kLens[] = {0, 1, 2, 16, 32, 255, 256, 300};
    std::string b(kLens[Uniform(0, std::size(kLens) - 1)], '\0');
    for (char& c : b) c = static_cast<char>(Uniform(0, 255));
    return b;
  }

  Value Key(int depth) {
    switch (Uniform(0, depth >= 3 ? 3 : 5)) {
      case 0:
        return Str(RandomStr(Chance(0.5) ? 1 : 12));
      case 1:
        return Int(Token(4));
      case 2:
        return Bytes(RandomBytes());
      case 3:
        return Chance(0.1) ? Uint(std::numeric_limits<uint64_t>::max() - Uniform(0, 5))
                           : Int(static_cast<int64_t>(Uniform(0, 3000)) - 1000);
      case 4:  // vLLM's multimodal (identifier, offset)
        return Tuple(
            {Str("mm-" + ToHex(RandomBytes())), Int(static_cast<int64_t>(Uniform(0, 4096)) - 64)});
      default:
        return KeyTuple(depth + 1);
    }
  }

  Value KeyTuple(int depth) {
    ValueArray a;
    const size_t n = Uniform(0, 6);
    for (size_t i = 0; i < n; ++i) {
      a.push_back(Key(depth));
      if (Chance(0.2)) a.push_back(a.back());  // a repeat: BINGET for CPython singletons only
    }
    return Tuple(std::move(a));
  }

  Case RandomCase() {
    Case c;
    c.algo = kAllHashAlgos[Uniform(0, std::size(kAllHashAlgos) - 1)];
    c.seed = Seed();
    c.block_size = Chance(0.3) ? Uniform(1, 16) : Uniform(1, 2000);
    const size_t blocks = Uniform(1, 3);
    const size_t tokens = blocks * c.block_size + (Chance(0.3) ? Uniform(0, c.block_size - 1) : 0);
    const int mode = static_cast<int>(Uniform(0, 4));
    c.tokens.reserve(tokens);
    for (size_t i = 0; i < tokens; ++i) c.tokens.push_back(Token(mode));
    if (Chance(0.5)) {
      for (size_t i = 0; i < blocks + Uniform(0, 1); ++i) {
        c.extra_keys.push_back(Chance(0.3) ? Value{} : KeyTuple(0));
      }
    }
    return c;
  }

 private:
  std::mt19937_64 rng_;
};

// Hand-picked cases for the pickle framer: frame splits at exact opcode boundaries, payloads of
// >= 64 KiB written outside frames, BINUNICODE/BINBYTES lengths, LONG_BINGET.
std::vector<Case> EdgeCases() {
  std::vector<Case> cases;
  auto add = [&](HashAlgo algo, std::string seed, std::vector<int64_t> tokens,
                 std::vector<Value> extra) {
    Case c;
    c.algo = algo;
    c.seed = std::move(seed);
    c.block_size = tokens.size();
    c.tokens = std::move(tokens);
    c.extra_keys = std::move(extra);
    cases.push_back(std::move(c));
  };
  for (HashAlgo algo : kAllHashAlgos) {
    // 36 bytes precede the first token (20 with a 16-byte xxhash parent); 5-byte BININTs reach
    // 64 KiB after 13100 (13103) of them.
    for (size_t n = 13097; n <= 13107; ++n) add(algo, "0", std::vector<int64_t>(n, 1 << 20), {});
    for (size_t n : {6550u, 6551u, 6552u, 13104u, 26210u, 30000u}) {
      add(algo, "0", std::vector<int64_t>(n, std::numeric_limits<int64_t>::max()), {});
    }
    // The extra keys straddle the first frame boundary.
    for (size_t n = 13090; n <= 13100; n += 2) {
      add(algo, "0", std::vector<int64_t>(n, 1 << 20),
          {Tuple({Str("salt"), Str("a"), Str("a"), Bytes("xy"), Tuple({Str("mm"), Int(7)})})});
    }
    // Large str/bytes around the 64 KiB bypass, seeds included.
    for (size_t len : {255u, 256u, 65535u, 65536u, 70000u, 140000u}) {
      add(algo, std::string(len, 's'), {1, 2, 3},
          {Tuple({Bytes(std::string(len, 'b')), Str(std::string(len, 'c')), Str("z"), Str("z")})});
      add(algo, "0", std::vector<int64_t>(13000, 1 << 20), {Tuple({Bytes(std::string(len, 'b'))})});
    }
    // More than 256 memoized objects before a repeated singleton: LONG_BINGET.
    ValueArray many;
    for (int i = 0; i < 300; ++i) many.push_back(Str("k" + std::to_string(i)));
    many.push_back(Str("q"));
    many.push_back(Str("k"));
    many.push_back(Str("q"));
    many.push_back(Bytes("Q"));
    many.push_back(Bytes("Q"));
    add(algo, "0", {5, 6, 7, 8}, {Tuple(many)});
    // 0..3 tokens: EMPTY_TUPLE / TUPLE1..3; 4+: MARK ... TUPLE.
    add(algo, "1", {42}, {Tuple({})});
    add(algo, "1", {42, 43}, {Tuple({Tuple({})})});
    add(algo, "1", {42, 43, 44}, {Tuple({Int(1), Int(2), Int(3)})});
  }
  return cases;
}

TEST(BlockHashTest, MatchesPythonReference) {
  ASSERT_EQ(::access(kPython, X_OK), 0)
      << kPython
      << " is missing: the reference hashes need Debian's python3 with python3-cbor2 and "
         "python3-xxhash";
  const unsigned seed = testing::TestSeed();
  Generator gen(seed);
  std::vector<Case> cases = EdgeCases();
  const size_t edge = cases.size();
  constexpr size_t kRandomCases = 800;  // about 200 per algorithm
  for (size_t i = 0; i < kRandomCases; ++i) cases.push_back(gen.RandomCase());

  testing::TempDir dir;
  const std::vector<std::string> lines = RunPython(cases, dir.path(), /*preimage=*/false);
  ASSERT_EQ(lines.size(), cases.size());

  size_t compared = 0;
  size_t mismatched = 0;
  size_t per_algo[std::size(kAllHashAlgos)] = {};
  size_t seed_errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto ours = OurHashes(c, /*preimage=*/false);
    ASSERT_TRUE(ours.ok()) << "case " << i << ": " << ours.status().ToString();
    const std::vector<std::string> theirs = Split(lines[i]);
    if (!theirs.empty() && theirs[0] == "error:") {
      ++seed_errors;
    } else {
      compared += theirs.size();
      per_algo[static_cast<size_t>(c.algo)] += theirs.size();
    }
    if (*ours == theirs) continue;
    ++mismatched;
    if (mismatched > 3) continue;
    // Show where the encodings first differ.
    std::string where;
    const std::vector<std::string> py = RunPython({c}, dir.path(), /*preimage=*/true);
    auto pre = OurHashes(c, /*preimage=*/true);
    if (py.size() == 1 && pre.ok()) {
      const auto pyp = Split(py[0]);
      for (size_t k = 0; k < pyp.size() && k < pre->size(); ++k) {
        const std::string& a = (*pre)[k];
        const std::string& b = pyp[k];
        if (a == b) continue;
        size_t off = 0;
        while (off < a.size() && off < b.size() && a[off] == b[off]) ++off;
        where = "object " + std::to_string(k) + " (0 = NONE_HASH) first differs at byte " +
                std::to_string(off / 2) + ": ours ..." +
                a.substr(off - std::min<size_t>(off, 20), 60) + " python ..." +
                b.substr(off - std::min<size_t>(off, 20), 60);
        break;
      }
    }
    ADD_FAILURE() << "case " << i << (i < edge ? " (edge)" : " (random)")
                  << " algo=" << HashAlgoName(c.algo) << " block_size=" << c.block_size
                  << " tokens=" << c.tokens.size() << " seed_len="
                  << (c.seed ? std::to_string(c.seed->size()) : std::string("unset"))
                  << " extra_keys=" << c.extra_keys.size() << "\n  " << where
                  << "\n  replay with KVO_TEST_SEED=" << seed;
  }
  EXPECT_EQ(mismatched, 0u);
  for (HashAlgo algo : kAllHashAlgos) {
    EXPECT_GT(per_algo[static_cast<size_t>(algo)], 0u) << HashAlgoName(algo);
  }
  EXPECT_GT(seed_errors, 0u) << "no xxhash case without a seed was drawn";
  std::printf(
      "[ python ] seed %u: %zu cases (%zu edge + %zu random), %zu digests compared (sha256 %zu, "
      "sha256_cbor %zu, xxhash %zu, xxhash_cbor %zu), %zu unseeded xxhash cases refused by both, "
      "%zu cases differ\n",
      seed, cases.size(), edge, kRandomCases, compared, per_algo[0], per_algo[1], per_algo[2],
      per_algo[3], seed_errors, mismatched);
}

}  // namespace
}  // namespace kvo
