// KeyHelper: a /query's content keys hashed on a helper thread while ParseRouterQuery reads the
// token list. Attacks: the keys equal ContentKeys for random prompts, block sizes and LoRA names;
// lists the scanner gives up on (End(false)) and bodies whose other fields fail (no Begin) leave
// no keys and no thread behind; many threads contending for the one helper (most get no lease,
// some claim a job the helper woke too late for) all get right answers — TSan checks the
// hand-over; and the service answers /query equally with and without the helper. With an index,
// the helper's walk of the keys equals Indexer::Tiered for random prompts (prefixes held on every
// tier, walks that end early), also while a writer changes the index (TSan: the reader lock the
// walk holds on the helper thread).
#include "indexer/service/key_helper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "indexer/indexer.h"
#include "indexer/service/router_api.h"
#include "tests/testing/stall_gate.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

std::string QueryBody(const std::vector<int64_t>& tokens, int64_t block_size,
                      const std::string& lora, bool block_size_last) {
  std::string list = "[";
  for (size_t i = 0; i < tokens.size(); ++i) list += (i ? "," : "") + std::to_string(tokens[i]);
  list += "]";
  std::string head = R"({"model": "m", )";
  if (!lora.empty()) head += R"("lora_name": ")" + lora + R"(", )";
  const std::string bs = R"("block_size": )" + std::to_string(block_size);
  return block_size_last ? head + R"("token_ids": )" + list + ", " + bs + "}"
                         : head + bs + R"(, "token_ids": )" + list + "}";
}

std::vector<int64_t> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::vector<int64_t> t(n);
  for (auto& x : t) x = static_cast<int64_t>(rng() % 150000);
  return t;
}

TEST(KeyHelperTest, KeysEqualContentKeysForRandomPrompts) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  KeyHelper helper;
  int with_keys = 0;
  for (int round = 0; round < 200; ++round) {
    const int64_t bs = std::vector<int64_t>{1, 3, 16, 64, 128}[rng() % 5];
    const size_t n = rng() % 3 == 0 ? rng() % 50 : rng() % 40000;
    const std::vector<int64_t> tokens = RandomTokens(rng, n);
    const std::string lora = rng() % 2 ? "" : "adapter-" + std::to_string(rng() % 10);
    const std::string body = QueryBody(tokens, bs, lora, rng() % 2 == 0);
    auto lease = helper.TryLease();
    ASSERT_NE(lease, nullptr);  // one query at a time here: always free
    auto q = ParseRouterQuery(body, false, 1 << 20, lease.get());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->token_ids, tokens);
    const std::vector<uint64_t> keys = lease->TakeKeys();
    if (keys.empty() && n / static_cast<size_t>(bs) > 0) continue;  // the helper woke too late
    ++with_keys;
    ASSERT_EQ(keys, *ContentKeys(tokens, bs, lora)) << "round " << round << " bs " << bs;
  }
  std::printf("helper hashed %llu of 200 prompts' keys (the rest: woke too late)\n",
              static_cast<unsigned long long>(helper.jobs_done()));
  EXPECT_GT(helper.jobs_done(), 0u);
  EXPECT_GT(with_keys, 0);
}

TEST(KeyHelperTest, GivenUpListsAndBadBodiesLeaveNoKeys) {
  KeyHelper helper;
  const std::vector<std::string> bodies = {
      // The scanner gives up on the list (the DOM reads it): End(false).
      R"({"model": "m", "block_size": 2, "token_ids": [1, 2, 3, 4.5]})",
      R"({"model": "m", "block_size": 2, "token_ids": [1, 2, [3], 4]})",
      // Read one by one (a sign, spaces): still fed.
      R"({"model": "m", "block_size": 2, "token_ids": [1, 2, -3, 4]})",
      // Another field is wrong: no Begin at all.
      R"({"model": 5, "block_size": 2, "token_ids": [1, 2, 3, 4]})",
      R"({"model": "m", "block_size": 0, "token_ids": [1, 2, 3, 4]})",
      R"({"model": "m", "token_ids": [1, 2, 3, 4]})",
  };
  for (const std::string& body : bodies) {
    auto lease = helper.TryLease();
    ASSERT_NE(lease, nullptr);
    auto q = ParseRouterQuery(body, false, 1000, lease.get());
    auto ref = ParseRouterQueryReference(body, false, 1000);
    EXPECT_EQ(q.ok(), ref.ok()) << body;
    if (q.ok() && ref.ok()) {
      EXPECT_EQ(q->token_ids, ref->token_ids) << body;
    }
    if (!q.ok()) {
      EXPECT_TRUE(lease->TakeKeys().empty()) << body;
    }
  }
  // A lease dropped right after Begin, mid-list: the helper lets go of the job.
  for (int i = 0; i < 50; ++i) {
    auto lease = helper.TryLease();
    ASSERT_NE(lease, nullptr);
    std::vector<int64_t> tokens(4096, 7);
    lease->Begin(16, "", tokens.size());
    lease->Tokens(tokens.data(), 1024);
    lease.reset();  // End(false), waiting for the helper if it started
  }
  auto lease = helper.TryLease();
  EXPECT_NE(lease, nullptr) << "a dropped lease kept the helper";
}

// Threads racing for the one helper: a query without a lease, or whose job the helper woke too
// late for, hashes on its own; every answer equals ContentKeys. (TSan: the hand-over of tokens and
// keys between the threads.)
TEST(KeyHelperTest, ContendedQueriesAllGetTheirOwnKeys) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  KeyHelper helper;
  std::atomic<int> wrong{0};
  std::atomic<int> leased{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint32_t>(t));
      for (int round = 0; round < 40; ++round) {
        const int64_t bs = 1 + static_cast<int64_t>(rng() % 32);
        const std::vector<int64_t> tokens = RandomTokens(rng, rng() % 20000);
        const std::string lora = "l" + std::to_string(t);
        const std::string body = QueryBody(tokens, bs, lora, false);
        auto lease = helper.TryLease();
        leased += lease != nullptr;
        auto q = ParseRouterQuery(body, false, 1 << 20, lease.get());
        if (!q.ok() || q->token_ids != tokens) {
          ++wrong;
          continue;
        }
        if (lease == nullptr) continue;
        const std::vector<uint64_t> keys = lease->TakeKeys();
        if (!keys.empty() && keys != *ContentKeys(tokens, bs, lora)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(leased.load(), 0);
}

// An index where `sources` engines each hold a random-depth prefix of `prompt` (GPU, the older
// part also or only on CPU, some on STORAGE; engine-0 the whole prompt), block size 16, stored
// with their token ids.
std::unique_ptr<Indexer> HeldPrefixes(const std::string& path, const std::vector<int64_t>& prompt,
                                      int sources, std::mt19937_64& rng) {
  IndexerOptions o;
  o.background_thread = false;
  auto idx = Indexer::Open(path, o);
  EXPECT_TRUE(idx.ok()) << idx.status().ToString();
  if (!idx.ok()) return nullptr;
  const size_t blocks = prompt.size() / 16;
  for (int src = 0; src < sources; ++src) {
    const size_t depth = src == 0 ? blocks : rng() % (blocks + 1);
    uint64_t seq = 0;
    for (size_t first = 0; first < depth; first += 32) {
      const size_t n = std::min<size_t>(32, depth - first);
      BlockStored st;
      for (size_t i = first; i < first + n; ++i) {
        st.block_hashes.push_back(BlockHash::Uint(1000 * (i + 1) + static_cast<uint64_t>(src)));
      }
      if (first > 0) {
        st.parent_block_hash = BlockHash::Uint(1000 * first + static_cast<uint64_t>(src));
      }
      st.token_ids.assign(prompt.begin() + static_cast<long>(first * 16),
                          prompt.begin() + static_cast<long>((first + n) * 16));
      st.block_size = 16;
      st.medium = first >= depth * 3 / 4 ? "CPU" : "GPU";
      EventBatch b;
      b.events.push_back(st);
      if (first < depth / 2 && st.medium == "GPU") {
        BlockStored copy;
        copy.block_hashes = st.block_hashes;
        copy.medium = src % 3 == 0 ? "STORAGE" : "CPU";
        b.events.push_back(copy);
      }
      EXPECT_TRUE((*idx)->ApplyBatch("engine-" + std::to_string(src), 0, ++seq, b).ok());
    }
  }
  return std::move(*idx);
}

// The walk on the helper (walk_thread false) or on a third thread following the hashing (true).
class KeyHelperWalkTest : public ::testing::TestWithParam<bool> {
 protected:
  // A random prompt of `blocks` blocks, `sources` engines holding prefixes of it (HeldPrefixes),
  // and a helper walking that index.
  void Hold(size_t blocks, int sources, KeyHelper::Options o = KeyHelper::Options()) {
    prompt_ = RandomTokens(rng_, 16 * blocks);
    idx_ = HeldPrefixes(dir_.path() + "/i.db", prompt_, sources, rng_);
    ASSERT_NE(idx_, nullptr);
    o.walk_thread = GetParam();
    helper_ = std::make_unique<KeyHelper>(idx_.get(), SystemClock(), o);
  }

  const uint32_t seed_ = testing::TestSeed();
  std::mt19937_64 rng_{seed_};
  ScopedTempDir dir_{"key-helper-walk"};
  std::vector<int64_t> prompt_;
  std::unique_ptr<Indexer> idx_;
  std::unique_ptr<KeyHelper> helper_;  // after idx_: destroyed first
};
INSTANTIATE_TEST_SUITE_P(WalkOnHelperOrOwnThread, KeyHelperWalkTest, ::testing::Bool());

TEST_P(KeyHelperWalkTest, WalksEqualTieredForRandomPrompts) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_NO_FATAL_FAILURE(Hold(2000, 12));
  int walked = 0;
  int ended_early = 0;
  for (int round = 0; round < 150; ++round) {
    // A prefix of the held prompt_ (every block held by engine-0), then tokens of its own in two
    // rounds of three (the walk ends at the first of them), or none held at all.
    std::vector<int64_t> tokens(prompt_.begin(),
                                prompt_.begin() + static_cast<long>(rng_() % prompt_.size()));
    if (round % 5 == 0) tokens.clear();
    if (round % 3 != 0) {
      for (const int64_t t : RandomTokens(rng_, rng_() % 3000)) tokens.push_back(t);
    }
    auto lease = helper_->TryLease();
    ASSERT_NE(lease, nullptr);
    auto q =
        ParseRouterQuery(QueryBody(tokens, 16, "", rng_() % 2 == 0), false, 1 << 20, lease.get());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    auto walk = lease->TakeWalk();
    // The helper woke too late (the handler walks), or no block (the handler does not walk).
    if (!walk || tokens.size() < 16) continue;
    ++walked;
    const std::vector<uint64_t> keys = lease->TakeKeys();
    ended_early += keys.empty() && tokens.size() >= 16;
    ScoreQuery sq;
    sq.token_ids = tokens;
    sq.block_size = 16;
    auto want = idx_->Tiered(sq);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(walk->size(), want->size()) << "round " << round;
    for (size_t i = 0; i < want->size(); ++i) {
      const Indexer::TieredMatch& a = (*walk)[i];
      const Indexer::TieredMatch& b = (*want)[i];
      EXPECT_EQ(std::tie(a.source, a.dp_rank, a.gpu, a.cpu, a.disk),
                std::tie(b.source, b.dp_rank, b.gpu, b.cpu, b.disk))
          << "round " << round << " instance " << b.source;
    }
    if (!keys.empty()) {
      EXPECT_EQ(keys, *ContentKeys(tokens, 16));
    }
  }
  std::printf("helper walked %d of 150 queries (%d ended before the last block)\n", walked,
              ended_early);
  EXPECT_GT(walked, 0);
  EXPECT_GT(walked, ended_early) << "no walk went to the last block";
}

// A helper stalled mid-chain (its thread held in before_batch, as a host that takes the CPU away
// would hold it): End(true) gives the job up after give_up_after_ns without progress and
// finishes the keys itself, so the parse returns without waiting (the keys, no walk: the handler
// walks them), and the lease's
// destructor waits for the helper; the next query's keys and walk are right. A watchdog releases
// the helper after 20 s, so an End that waits for it fails instead of hanging.
TEST_P(KeyHelperWalkTest, AStalledHelperIsGivenUpAndTheLeaseWaitsForIt) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  testing::StallGate gate;  // the helper stops at its third batch while held
  KeyHelper::Options o;
  o.give_up_after_ns = 200'000;
  o.before_batch = [&] { gate.Hook(); };
  ASSERT_NO_FATAL_FAILURE(Hold(2000, 12, o));
  ScoreQuery sq;
  sq.token_ids = prompt_;
  sq.block_size = 16;
  const auto want = idx_->Tiered(sq);
  ASSERT_TRUE(want.ok());
  int gave_up = 0;
  for (int round = 0; round < 10; ++round) {
    // Odd rounds: after a stall, a query that must get its walk.
    if (round % 2 == 0) gate.Hold(3);
    gate.StartWatchdog();
    auto lease = helper_->TryLease();
    ASSERT_NE(lease, nullptr);
    // As the parse feeds it, the list whole at once; a stalled round ends once the helper is held.
    lease->Begin(16, "", prompt_.size());
    lease->Tokens(prompt_.data(), prompt_.size());
    if (round % 2 == 0) {
      ASSERT_TRUE(gate.WaitHeld());
    }
    lease->End(true);
    EXPECT_FALSE(gate.StopWatchdog()) << "round " << round << ": End waited for the stalled helper";
    auto walk = lease->TakeWalk();
    auto keys = lease->TakeKeys();
    // (A round that did not stall may still give up: this machine can deschedule the helper.)
    if (round % 2 == 0) {
      EXPECT_TRUE(lease->gave_up()) << "round " << round;
    }
    if (lease->gave_up()) {
      // No walk; the keys: those the helper published before it stopped (with the walk thread),
      // the rest hashed by End on this thread.
      gave_up += round % 2 == 0;
      EXPECT_FALSE(walk.has_value()) << "round " << round;
      EXPECT_EQ(keys, *ContentKeys(prompt_, 16)) << "round " << round;
    } else if (walk) {
      ASSERT_EQ(walk->size(), want->size()) << "round " << round;
      for (size_t i = 0; i < want->size(); ++i) {
        EXPECT_EQ((*walk)[i].disk, (*want)[i].disk) << "round " << round;
      }
    }
    gate.Release();
    lease.reset();  // waits for the helper to leave the given-up job
  }
  EXPECT_EQ(gave_up, 5) << "a stalled round's job was not given up";
}

// Leases dropped mid-list, and lists longer than Begin announced, while walks are under way:
// the helper and the walk thread let go (the lock given back: a writer gets in afterwards).
TEST_P(KeyHelperWalkTest, DroppedAndOverlongJobsLetGo) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_NO_FATAL_FAILURE(Hold(500, 4));
  for (int i = 0; i < 100; ++i) {
    auto lease = helper_->TryLease();
    ASSERT_NE(lease, nullptr);
    // (Only the walk thread relies on the announced size: its keys must not move.)
    const bool overlong = GetParam() && i % 2 == 1;
    lease->Begin(16, "", overlong ? 16 * 64 : prompt_.size());
    lease->Tokens(prompt_.data(), overlong ? prompt_.size() : prompt_.size() / 3);
    if (overlong) {
      lease->End(true);
      // An overlong job hashes no further than it announced: no walk, no keys handed over.
      EXPECT_FALSE(lease->TakeWalk().has_value()) << i;
      EXPECT_TRUE(lease->TakeKeys().empty()) << i;
    }
    lease.reset();  // End(false) when not ended: waits for the helper (and the walk) to let go
  }
  BlockStored st;
  st.block_hashes.push_back(BlockHash::Uint(77));
  st.medium = "GPU";
  EventBatch b;
  b.events.push_back(st);
  EXPECT_TRUE(idx_->ApplyBatch("after", 0, 1, b).ok()) << "the index's lock was kept";
}

// A writer applying batches while the helper walks: no deadlock (the walk's reader lock is the
// helper thread's, given back when the parse ends) and every answer names held sources only.
TEST_P(KeyHelperWalkTest, WalksBesideAWriter) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_NO_FATAL_FAILURE(Hold(300, 4));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t seq = 1; !stop.load(); ++seq) {
      BlockStored st;
      st.block_hashes.push_back(BlockHash::Uint(seq));
      st.token_ids.assign(prompt_.begin(), prompt_.begin() + 16);
      st.block_size = 16;
      st.medium = "GPU";
      EventBatch b;
      b.events.push_back(st);
      ASSERT_TRUE(idx_->ApplyBatch("writer", 0, seq, b).ok());
    }
  });
  for (int round = 0; round < 60; ++round) {
    auto lease = helper_->TryLease();
    ASSERT_NE(lease, nullptr);
    auto q = ParseRouterQuery(QueryBody(prompt_, 16, "", false), false, 1 << 20, lease.get());
    ASSERT_TRUE(q.ok());
    auto walk = lease->TakeWalk();
    if (!walk) continue;
    for (const Indexer::TieredMatch& m : *walk) {
      EXPECT_TRUE(m.source.rfind("engine-", 0) == 0 || m.source == "writer") << m.source;
      EXPECT_LE(m.gpu, m.cpu);
      EXPECT_LE(m.cpu, m.disk);
    }
  }
  stop = true;
  writer.join();
}

}  // namespace
}  // namespace kvo
