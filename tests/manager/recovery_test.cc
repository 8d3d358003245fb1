// Event sourcing, as a property: random operation sequences against a manager with a CPU tier and
// two bounded secondary tiers, journaling every batch. After every publish,
//   (1) a consumer folding the published (journaled) events holds exactly the blocks the manager
//       holds, per medium, hash for hash (placeholder and self-describing forms);
//   (2) the state rebuilt from the journal (ReplayJournal) equals the live state;
// the consumer is the one meaning of the events (events/event_fold.h), whose AllBlocksCleared
// never touches CPU or STORAGE: a reset must announce its CPU removals;
// then a crash (in-flight jobs lost) and OffloadManager::Recover: the restart batch makes the
// consumer exact again (CPU gone with reason "restart", the tiers reconciled with their medium),
// and it stays exact as the recovered manager goes on. The seed is printed (KVO_TEST_SEED).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "events/codec.h"
#include "events/event_fold.h"
#include "events/journal.h"
#include "manager/event_fold.h"
#include "manager/indexed_tier.h"
#include "manager/offload_manager.h"
#include "manager/testing/offload_manager_peer.h"
#include "tests/manager/fake_transport.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using HashCounts = std::map<std::pair<int64_t, uint64_t>, int64_t>;

OffloadKey K(int i) { return OffloadKey::FromDigest("key" + std::to_string(i), i % 2); }

// The chunk metadata of key i: two blocks, the last one the key's own hash (B.4).
BlockStored Meta(int i) {
  BlockStored m;
  m.block_hashes = {BlockHash::Uint(0xABC00000ull + static_cast<uint64_t>(i)),
                    BlockHash::Uint(K(i).Wire())};
  m.token_ids = {i, i + 1, i + 2, i + 3};
  m.block_size = 2;
  m.kv_cache_spec_kind = "full_attention";
  if (i > 0) m.parent_block_hash = BlockHash::Uint(K(i - 1).Wire());
  return m;
}

// A consumer of the published events: the one meaning of KV events (events/event_fold.h), plus
// the removal reasons it saw.
struct Consumer {
  KvEventFold fold;
  std::map<std::string, int> removals;  // "<medium>/<reason>" -> removal events seen
  void Apply(const EventBatch& batch) {
    fold.Apply(batch);
    for (const KvEvent& e : batch.events) {
      if (const auto* r = std::get_if<BlockRemoved>(&e)) {
        ++removals[*r->medium + "/" + r->reason.value_or("")];
      }
    }
  }
  // (group, hash) -> count of one medium.
  HashCounts Held(const std::string& medium) const {
    HashCounts out;
    for (const auto& [id, n] : fold.ByBlock(medium)) out[{id.group, id.hash}] += n;
    return out;
  }
};

class RecoveryTest : public ::testing::TestWithParam<std::tuple<bool, std::string>> {
 protected:
  void SetUp() override {
    seed_ = kvo::testing::TestSeed();
    rng_.seed(seed_);
    JournalOptions jo;
    jo.dir = dir_.path() + "/journal";
    auto j = Journal::Open(jo);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(j).value();
  }

  bool self_describing() const { return std::get<0>(GetParam()); }

  ManagerOptions Options() {
    ManagerOptions o;
    o.num_blocks = 8;
    o.eviction_policy = std::get<1>(GetParam());
    o.self_describing_events = self_describing();
    o.track_blocks = true;
    o.journal = journal_.get();
    for (int t = 0; t < 2; ++t) {
      IndexedTierOptions to;
      to.name = t == 0 ? "fs" : "remote";
      to.locality = t == 0 ? "LOCAL" : "REMOTE";
      to.block_bytes = 64;
      to.max_bytes = t == 0 ? 6 * 64 : 10 * 64;
      auto tier = IndexedTier::Create(to, transports_[t]);
      EXPECT_TRUE(tier.ok()) << tier.status().ToString();
      o.secondary_tiers.push_back(std::shared_ptr<IndexedTier>(std::move(tier).value()));
    }
    return o;
  }

  // Reads the journal records the consumer has not seen yet.
  void ConsumeJournal() {
    if (journal_->empty()) return;
    auto reader = journal_->NewReader(next_seq_);
    ASSERT_TRUE(reader.ok());
    JournalRecord rec;
    while (true) {
      auto more = (*reader)->Next(&rec);
      ASSERT_TRUE(more.ok()) << more.status().ToString();
      if (!*more) break;
      auto batch = DecodeBatch(rec.payload);
      ASSERT_TRUE(batch.ok()) << batch.status().ToString();
      consumer_.Apply(*batch);
      fold_.Apply(*batch);
      next_seq_ = rec.seq + 1;
    }
  }

  // `full_replay`: rebuild the state from the whole journal (ReplayJournal) instead of the fold
  // kept up to date batch by batch.
  void CheckExact(OffloadManager& m, const std::string& when, bool full_replay = false) {
    SCOPED_TRACE(when + " (seed " + std::to_string(seed_) + ")");
    ASSERT_TRUE(m.PublishEvents().ok());
    ConsumeJournal();
    auto snap = m.Snapshot();
    ASSERT_TRUE(snap.ok());
    // (1) the consumer holds exactly what the manager holds, per medium.
    EXPECT_EQ(consumer_.Held(kMediumCpu), snap->cpu_hashes);
    EXPECT_EQ(consumer_.Held(kMediumStorage), snap->storage_hashes);
    // (2) the journal's fold is the live state.
    Result<JournalFold> fold = fold_;
    if (full_replay) fold = ReplayJournal(*journal_);
    ASSERT_TRUE(fold.ok()) << fold.status().ToString();
    EXPECT_EQ(fold->Hashes(kMediumCpu), snap->cpu_hashes);
    EXPECT_EQ(fold->Hashes(kMediumStorage), snap->storage_hashes);
    // Every chunk the manager holds is announced: its wire hash (the chunk's last) is held.
    for (const OffloadKey& k : snap->cpu)
      EXPECT_GT(snap->cpu_hashes.count({k.group(), k.Wire()}), 0u);
    Status s = OffloadManagerPeer::CheckInvariants(m);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  std::vector<OffloadKey> RandomKeys(size_t max) {
    std::vector<OffloadKey> keys;
    const size_t n = 1 + rng_() % max;
    const int start = static_cast<int>(rng_() % 30);
    for (size_t i = 0; i < n; ++i) keys.push_back(K(start + static_cast<int>(i)));
    return keys;
  }

  // One random operation, as the scheduler and the transfer engine would issue them.
  void Step(OffloadManager& m) {
    const RequestContext ctx{"req" + std::to_string(rng_() % 3), std::nullopt, std::nullopt};
    switch (rng_() % 10) {
      case 0:
      case 1: {  // a prefix scan, then loads of what hit
        std::vector<OffloadKey> hits;
        for (const OffloadKey& k : RandomKeys(5)) {
          const LookupResult r = m.Lookup(k, ctx);
          if (r != LookupResult::kHit) break;
          hits.push_back(k);
        }
        if (!hits.empty() && rng_() % 2 == 0) {
          // A later lookup of the scan may have promoted a block into the slot of an earlier
          // hit (as in vLLM); then the load is refused and nothing changes.
          auto slots = m.PrepareLoad(hits, ctx);
          if (slots.ok()) loading_.push_back(hits);
        }
        break;
      }
      case 2:
      case 3: {
        std::vector<OffloadKey> keys = RandomKeys(4);
        if (self_describing()) {
          for (const OffloadKey& k : keys) {
            const int i = std::stoi(std::string(k.digest()).substr(3));
            m.RecordChunkMetadata(k, Meta(i));
          }
        }
        auto out = m.PrepareStore(keys, ctx);
        ASSERT_TRUE(out.ok());
        if (out->has_value() && !(*out)->keys_to_store.empty()) {
          writing_.push_back({ctx, (*out)->keys_to_store});
        }
        m.Touch(keys, ctx);
        break;
      }
      case 4:
        if (!writing_.empty()) {
          const size_t i = rng_() % writing_.size();
          ASSERT_TRUE(m.CompleteStore(writing_[i].second, writing_[i].first, rng_() % 6 != 0).ok());
          writing_.erase(writing_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 5:
        if (!loading_.empty()) {
          const size_t i = rng_() % loading_.size();
          ASSERT_TRUE(m.CompleteLoad(loading_[i], ctx).ok());
          loading_.erase(loading_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 6:
      case 7: {  // the transfer engine finishes a job: success, partial, or a corrupt block
        FakeTransport& t = *transports_[rng_() % 2];
        if (t.submitted.empty()) break;
        const TierJob& job = t.submitted[rng_() % t.submitted.size()];
        const unsigned kind = rng_() % 8;
        if (kind < 5) {
          t.Finish(job.job_id, true);
        } else {
          std::vector<OffloadKey> ok(job.keys.begin(), job.keys.begin() + job.keys.size() / 2);
          std::vector<OffloadKey> lost;
          if (job.is_promotion && kind >= 6) lost.push_back(job.keys.back());
          t.Finish(job.job_id, false, ok, lost);
        }
        break;
      }
      case 8:
        m.OnScheduleEnd();
        if (rng_() % 4 == 0) m.OnRequestFinished(ctx);
        break;
      case 9:
        if (rng_() % 25 == 0) {
          // reset_cache: the scheduler flushes its jobs, so nothing in flight survives it.
          m.ResetCache();
          writing_.clear();
          loading_.clear();
        }
        break;
    }
  }

  kvo::testing::TempDir dir_;
  unsigned seed_ = 0;
  std::mt19937 rng_;
  std::unique_ptr<Journal> journal_;
  std::shared_ptr<FakeTransport> transports_[2] = {std::make_shared<FakeTransport>(),
                                                   std::make_shared<FakeTransport>()};
  Consumer consumer_;
  JournalFold fold_;
  uint64_t next_seq_ = 0;
  std::vector<std::pair<RequestContext, std::vector<OffloadKey>>> writing_;
  std::vector<std::vector<OffloadKey>> loading_;
};

TEST_P(RecoveryTest, JournalFoldAndConsumerEqualTheLiveStateAcrossARestart) {
  for (int run = 0; run < 3; ++run) {
    auto created = run == 0 ? OffloadManager::Create(Options())
                            : OffloadManager::Recover(Options(), *journal_);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    std::unique_ptr<OffloadManager> m = std::move(created).value();
    writing_.clear();
    loading_.clear();
    CheckExact(*m, "after start " + std::to_string(run), /*full_replay=*/true);
    if (run > 0) {
      const auto snap = m->Snapshot();
      ASSERT_TRUE(snap.ok());
      EXPECT_TRUE(snap->cpu.empty());  // volatile: gone
      EXPECT_TRUE(consumer_.Held(kMediumCpu).empty());
    }
    for (int step = 0; step < 1500; ++step) {
      Step(*m);
      if (::testing::Test::HasFatalFailure()) return;
      if (step % 7 == 0) {
        CheckExact(*m, "run " + std::to_string(run) + " step " + std::to_string(step));
        if (::testing::Test::HasFailure()) return;
      }
    }
    // Settle, then hold at least one CPU block when the crash comes.
    for (const auto& [ctx, keys] : writing_) ASSERT_TRUE(m->CompleteStore(keys, ctx).ok());
    for (const auto& keys : loading_) ASSERT_TRUE(m->CompleteLoad(keys, RequestContext{}).ok());
    writing_.clear();
    loading_.clear();
    m->OnScheduleEnd();  // sends the step's promotions
    for (auto& t : transports_) t->FinishAll();
    m->OnScheduleEnd();
    m->OnScheduleEnd();
    const std::vector<OffloadKey> last{K(100 + run)};
    auto out = m->PrepareStore(last, RequestContext{});
    ASSERT_TRUE(out.ok() && out->has_value()) << "seed " << seed_;
    ASSERT_TRUE(m->CompleteStore(last, RequestContext{}).ok());
    CheckExact(*m, "end of run " + std::to_string(run), /*full_replay=*/true);
    // Crash: the process dies with jobs in flight.
    m.reset();
    for (auto& t : transports_) {
      t->Crash();
      // and a block is lost from the medium meanwhile (a disk cleaned up by hand).
      if (!t->medium.empty()) t->medium.erase(t->medium.begin());
    }
  }
  // The runs went through every kind of change.
  for (const char* kind :
       {"CPU/evicted", "CPU/restart", "STORAGE/evicted", "STORAGE/failed", "STORAGE/restart"}) {
    EXPECT_GT(consumer_.removals[kind], 0) << kind << " (seed " << seed_ << ")";
  }
}

TEST_P(RecoveryTest, RestartAnnouncesCpuRemovalsWithReasonRestart) {
  {
    auto m = std::move(OffloadManager::Create(Options())).value();
    auto out = m->PrepareStore(std::vector<OffloadKey>{K(1), K(2)}, RequestContext{});
    ASSERT_TRUE(out.ok() && out->has_value());
    ASSERT_TRUE(m->CompleteStore(std::vector<OffloadKey>{K(1), K(2)}, RequestContext{}).ok());
    ASSERT_TRUE(m->PublishEvents().ok());
  }
  const uint64_t last = journal_->last_seq();
  auto m = OffloadManager::Recover(Options(), *journal_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(journal_->last_seq(), last + 1);
  auto reader = journal_->NewReader(last + 1);
  ASSERT_TRUE(reader.ok());
  JournalRecord rec;
  ASSERT_TRUE(*(*reader)->Next(&rec));
  auto batch = DecodeBatch(rec.payload);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->events.size(), 2u);  // one per group (K(1) is group 1, K(2) group 0)
  for (const KvEvent& e : batch->events) {
    const auto& r = std::get<BlockRemoved>(e);
    EXPECT_EQ(r.medium, kMediumCpu);
    EXPECT_EQ(r.reason, RemovalReasonName(RemovalReason::kRestart));
    EXPECT_EQ(r.block_hashes.size(), self_describing() ? 1u : 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(FormsAndPolicies, RecoveryTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values("lru", "arc")));

TEST(RecoveryJournalTest, ACorruptPayloadIsReportedWithItsSeq) {
  kvo::testing::TempDir dir;
  JournalOptions jo;
  jo.dir = dir.path();
  auto j = Journal::Open(jo);
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->Append(5, "not msgpack").ok());
  auto fold = ReplayJournal(**j);
  ASSERT_FALSE(fold.ok());
  EXPECT_EQ(fold.status().code(), StatusCode::kCorruption);
  EXPECT_NE(fold.status().message().find("seq 5"), std::string::npos);
}

// TakeEventsAndJournal: the caller gets the OffloadingEvents (vLLM's connector publishes them) and
// the journal gets the same events as one KV batch, so a restart can recover from it.
TEST(RecoveryJournalTest, TakeEventsAndJournalHandsOutAndJournalsTheSameEvents) {
  kvo::testing::TempDir dir;
  JournalOptions jo;
  jo.dir = dir.path();
  auto j = Journal::Open(jo);
  ASSERT_TRUE(j.ok());
  ManagerOptions o;
  o.num_blocks = 2;
  o.journal = j->get();
  auto m = OffloadManager::Create(o);
  ASSERT_TRUE(m.ok());
  RequestContext ctx;
  std::vector<OffloadKey> keys = {K(1), K(2), K(3)};
  for (const OffloadKey& k : keys) {
    ASSERT_TRUE((*m)->PrepareStore(std::span(&k, 1), ctx).ok());
    ASSERT_TRUE((*m)->CompleteStore(std::span(&k, 1), ctx).ok());
  }
  std::vector<OffloadingEvent> out;
  ASSERT_TRUE((*m)->TakeEventsAndJournal(&out).ok());
  ASSERT_EQ(out.size(), 4u);  // stored 1, stored 2, evicted 1, stored 3
  EXPECT_FALSE(out[0].removed());
  EXPECT_TRUE(out[2].removed());
  EXPECT_EQ(out[2].keys, std::vector<OffloadKey>{K(1)});
  ASSERT_FALSE((*j)->empty());
  EXPECT_EQ((*j)->first_seq(), (*j)->last_seq());  // one batch
  auto reader = (*j)->NewReader(0);
  ASSERT_TRUE(reader.ok());
  JournalRecord rec;
  ASSERT_TRUE(*(*reader)->Next(&rec));
  auto batch = DecodeBatch(rec.payload);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->events.size(), 4u);
  const auto* removed = std::get_if<BlockRemoved>(&batch->events[2]);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->block_hashes, std::vector<BlockHash>{BlockHash::Uint(K(1).Wire())});
  EXPECT_EQ(removed->reason, std::optional<std::string>("evicted"));
  // Nothing new: no batch.
  ASSERT_TRUE((*m)->TakeEventsAndJournal(&out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ((*j)->first_seq(), (*j)->last_seq());
  // A restart from that journal.
  auto r = OffloadManager::Recover(o, **j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace kvo
