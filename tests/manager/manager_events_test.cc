// The manager's KV events (vllm-compat.md B.9, vLLM's offloading_connector/test_events.py rules):
// placeholder form, self-describing form, removals grouped by group, removal before store,
// re-storing after eviction, reset; and the path to the journal and a journaled publisher.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "events/codec.h"
#include "events/event_fold.h"
#include "events/journal.h"
#include "events/zmq_publisher.h"
#include "manager/event_fold.h"
#include "manager/offload_manager.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

OffloadKey K(int i, uint32_t group = 0) {
  return OffloadKey::FromDigest(std::string(24, 'k') + std::to_string(1000000 + i), group);
}
const RequestContext kCtx{};

std::unique_ptr<OffloadManager> Make(size_t num_blocks, bool self_describing = false,
                                     Journal* journal = nullptr,
                                     EventPublisher* publisher = nullptr) {
  ManagerOptions o;
  o.num_blocks = num_blocks;
  o.self_describing_events = self_describing;
  o.journal = journal;
  o.publisher = publisher;
  o.data_parallel_rank = 0;
  auto m = OffloadManager::Create(std::move(o));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

void StoreAll(OffloadManager& m, const std::vector<OffloadKey>& keys) {
  auto out = m.PrepareStore(keys, kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  ASSERT_TRUE(m.CompleteStore((*out)->keys_to_store, kCtx).ok());
}

std::vector<KvEvent> Take(OffloadManager& m) {
  std::vector<KvEvent> out;
  m.TakeKvEvents(&out);
  return out;
}

// A chunk of 2 blocks whose last block hash is the key's wire hash (B.4).
BlockStored Meta(const OffloadKey& key, uint64_t first_hash, std::optional<uint64_t> parent) {
  BlockStored m;
  m.block_hashes = {BlockHash::Uint(first_hash), BlockHash::Uint(key.Wire())};
  if (parent) m.parent_block_hash = BlockHash::Uint(*parent);
  m.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  m.block_size = 4;
  m.kv_cache_spec_kind = "full_attention";
  return m;
}

TEST(ManagerEventsTest, PlaceholderStoredIsOnePerKey) {
  auto m = Make(4);
  StoreAll(*m, {K(1), K(2, 1)});
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& s = std::get<BlockStored>(events[i]);
    const OffloadKey key = i == 0 ? K(1) : K(2, 1);
    EXPECT_EQ(s.block_hashes, std::vector<BlockHash>{BlockHash::Uint(key.Wire())});
    EXPECT_EQ(s.parent_block_hash, std::nullopt);
    EXPECT_TRUE(s.token_ids.empty());
    EXPECT_EQ(s.block_size, 0);
    EXPECT_EQ(s.lora_id, std::nullopt);
    EXPECT_EQ(s.lora_name, std::nullopt);
    EXPECT_EQ(s.medium, kMediumCpu);
    EXPECT_EQ(s.group_idx, static_cast<int64_t>(key.group()));
    EXPECT_EQ(s.locality, std::nullopt);
    EXPECT_EQ(s.kv_cache_spec_kind, std::nullopt);
  }
}

TEST(ManagerEventsTest, RemovalsAreGroupedByGroupAndPrecedeTheStore) {
  auto m = Make(3);
  StoreAll(*m, {K(1, 0), K(2, 1), K(3, 0)});
  Take(*m);
  StoreAll(*m, {K(4), K(5), K(6)});  // evicts 1, 2, 3
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 5u);
  const auto& r0 = std::get<BlockRemoved>(events[0]);
  EXPECT_EQ(r0.group_idx, 0);
  EXPECT_EQ(r0.block_hashes,
            (std::vector<BlockHash>{BlockHash::Uint(K(1).Wire()), BlockHash::Uint(K(3).Wire())}));
  EXPECT_EQ(r0.medium, kMediumCpu);
  EXPECT_EQ(r0.reason, RemovalReasonName(RemovalReason::kEvicted));
  const auto& r1 = std::get<BlockRemoved>(events[1]);
  EXPECT_EQ(r1.group_idx, 1);
  EXPECT_EQ(r1.block_hashes, std::vector<BlockHash>{BlockHash::Uint(K(2, 1).Wire())});
  for (size_t i = 2; i < 5; ++i) EXPECT_TRUE(std::holds_alternative<BlockStored>(events[i]));
}

TEST(ManagerEventsTest, SelfDescribingStoredAndRemovalFanOut) {
  auto m = Make(1, /*self_describing=*/true);
  const OffloadKey a = K(1);
  m->RecordChunkMetadata(a, Meta(a, 111, 99));
  StoreAll(*m, {a});
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 1u);
  const auto& s = std::get<BlockStored>(events[0]);
  EXPECT_EQ(s.block_hashes,
            (std::vector<BlockHash>{BlockHash::Uint(111), BlockHash::Uint(a.Wire())}));
  EXPECT_EQ(s.parent_block_hash, BlockHash::Uint(99));
  EXPECT_EQ(s.token_ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.block_size, 4);
  EXPECT_EQ(s.group_idx, 0);
  EXPECT_EQ(s.kv_cache_spec_kind, "full_attention");
  EXPECT_EQ(s.medium, kMediumCpu);

  // A key without metadata is a placeholder even in self-describing mode.
  StoreAll(*m, {K(2)});  // evicts a: the removal fans out to a's per-block hashes
  events = Take(*m);
  ASSERT_EQ(events.size(), 2u);
  const auto& r = std::get<BlockRemoved>(events[0]);
  EXPECT_EQ(r.block_hashes,
            (std::vector<BlockHash>{BlockHash::Uint(111), BlockHash::Uint(a.Wire())}));
  const auto& p = std::get<BlockStored>(events[1]);
  EXPECT_EQ(p.block_size, 0);
  EXPECT_EQ(p.block_hashes, std::vector<BlockHash>{BlockHash::Uint(K(2).Wire())});
}

// The recorded chunk is the BlockStored payload itself: every field the caller set is announced
// as given (a field vLLM adds needs no manager change); only medium, group_idx and locality are
// the announcement's own.
TEST(ManagerEventsTest, SelfDescribingStoredIsTheRecordedPayload) {
  auto m = Make(2, /*self_describing=*/true);
  const OffloadKey a = K(1, 1);
  BlockStored chunk = Meta(a, 7, 6);
  chunk.lora_id = 3;
  chunk.lora_name = "adapter";
  chunk.kv_cache_spec_sliding_window = 128;
  chunk.extra_keys = std::vector<Value>{Value{}, Value{ValueArray{Value{std::string("img")}}}};
  chunk.ownership = "owner";
  chunk.session_id = "session";
  chunk.medium = "GPU";       // the announcement's: replaced
  chunk.group_idx = 9;        // the key's group wins
  chunk.locality = "REMOTE";  // the tier's (none for the CPU tier)
  m->RecordChunkMetadata(a, chunk);
  StoreAll(*m, {a});
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 1u);
  BlockStored want = chunk;
  want.medium = kMediumCpu;
  want.group_idx = 1;
  want.locality = std::nullopt;
  EXPECT_EQ(std::get<BlockStored>(events[0]), want);
}

// OffloadingEvent's change is typed: a store, an eviction (reason evicted), a reset (cleared).
TEST(ManagerEventsTest, OffloadingEventChangeIsTyped) {
  auto m = Make(1);
  StoreAll(*m, {K(1)});
  StoreAll(*m, {K(2)});  // evicts K(1)
  m->ResetCache();
  std::vector<OffloadingEvent> events = m->TakeEvents();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0], OffloadingEvent::Stored({K(1)}, Medium::kCpu));
  EXPECT_EQ(events[1], OffloadingEvent::Removed({K(1)}, Medium::kCpu, RemovalReason::kEvicted));
  EXPECT_EQ(events[2], OffloadingEvent::Stored({K(2)}, Medium::kCpu));
  EXPECT_EQ(events[3], OffloadingEvent::Cleared({K(2)}, Medium::kCpu));
  EXPECT_TRUE(std::holds_alternative<KeysCleared>(events[3].change));
  EXPECT_TRUE(events[3].removed());
  EXPECT_EQ(events[3].reason(), RemovalReason::kCleared);
  EXPECT_FALSE(events[0].removed());
  EXPECT_EQ(events[0].reason(), RemovalReason::kNone);
}

TEST(ManagerEventsTest, ReStoringAfterEvictionNeedsFreshMetadata) {
  auto m = Make(1, /*self_describing=*/true);
  const OffloadKey a = K(1);
  m->RecordChunkMetadata(a, Meta(a, 111, std::nullopt));
  StoreAll(*m, {a});
  StoreAll(*m, {K(2)});  // evicts a; its snapshot is popped
  StoreAll(*m, {a});     // evicts 2; a comes back without metadata: placeholder
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(std::get<BlockStored>(events[0]).block_size, 4);
  EXPECT_EQ(std::get<BlockRemoved>(events[1]).block_hashes.size(), 2u);
  EXPECT_EQ(std::get<BlockStored>(events[2]).block_hashes,
            std::vector<BlockHash>{BlockHash::Uint(K(2).Wire())});
  EXPECT_EQ(std::get<BlockRemoved>(events[3]).block_hashes,
            std::vector<BlockHash>{BlockHash::Uint(K(2).Wire())});
  EXPECT_EQ(std::get<BlockStored>(events[4]).block_size, 0);

  // Recorded again: self-describing again, and the removal repeats it.
  m->RecordChunkMetadata(K(3), Meta(K(3), 333, 0));
  StoreAll(*m, {K(3)});
  events = Take(*m);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(std::get<BlockRemoved>(events[0]).block_hashes,
            std::vector<BlockHash>{BlockHash::Uint(a.Wire())});  // a was a placeholder
  EXPECT_EQ(std::get<BlockStored>(events[1]).block_size, 4);
}

TEST(ManagerEventsTest, MetadataRecordedAfterTheStoreDoesNotChangeTheRemoval) {
  auto m = Make(1, /*self_describing=*/true);
  StoreAll(*m, {K(1)});
  EXPECT_EQ(std::get<BlockStored>(Take(*m)[0]).block_size, 0);  // announced as a placeholder
  m->RecordChunkMetadata(K(1), Meta(K(1), 5, std::nullopt), /*overwrite=*/false);  // lookup
  StoreAll(*m, {K(2)});
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 2u);
  // Removed as announced, so consumers stay exact.
  EXPECT_EQ(std::get<BlockRemoved>(events[0]).block_hashes,
            std::vector<BlockHash>{BlockHash::Uint(K(1).Wire())});
}

TEST(ManagerEventsTest, FailedStoreDropsMetadataAndEmitsNothing) {
  auto m = Make(2, /*self_describing=*/true);
  m->RecordChunkMetadata(K(1), Meta(K(1), 5, std::nullopt));
  auto out = m->PrepareStore(std::vector<OffloadKey>{K(1)}, kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  ASSERT_TRUE(m->CompleteStore(std::vector<OffloadKey>{K(1)}, kCtx, false).ok());
  EXPECT_TRUE(Take(*m).empty());
  StoreAll(*m, {K(1)});
  EXPECT_EQ(std::get<BlockStored>(Take(*m)[0]).block_size, 0);  // metadata went with the failure
}

TEST(ManagerEventsTest, ResetIsACpuRemovalThatConsumersUnderstand) {
  // vLLM's consumers read AllBlocksCleared as "the GPU prefix cache is gone": a reset of the CPU
  // tier must be announced as CPU removals, or every consumer keeps the CPU blocks.
  auto m = Make(2);
  StoreAll(*m, {K(1)});
  m->ResetCache();
  std::vector<KvEvent> events = Take(*m);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<BlockStored>(events[0]));
  const auto* removed = std::get_if<BlockRemoved>(&events[1]);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->medium, std::optional<std::string>(kMediumCpu));
  EXPECT_EQ(removed->reason,
            std::optional<std::string>(RemovalReasonName(RemovalReason::kCleared)));
  KvEventFold fold;
  for (const KvEvent& e : events) fold.Apply(e);
  EXPECT_EQ(fold.size(), 0u);
}

TEST(ManagerEventsTest, PublishEventsAppendsOneBatchPerCallToTheJournal) {
  kvo::testing::TempDir dir;
  JournalOptions jo;
  jo.dir = dir.path() + "/journal";
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  auto m = Make(2, false, journal->get());
  ASSERT_TRUE(m->PublishEvents().ok());  // nothing to publish: no batch
  EXPECT_TRUE((*journal)->empty());
  StoreAll(*m, {K(1), K(2)});
  ASSERT_TRUE(m->PublishEvents().ok());
  StoreAll(*m, {K(3)});
  ASSERT_TRUE(m->PublishEvents().ok());
  EXPECT_EQ((*journal)->first_seq(), 0u);
  EXPECT_EQ((*journal)->last_seq(), 1u);

  auto reader = (*journal)->NewReader(0);
  ASSERT_TRUE(reader.ok());
  JournalRecord rec;
  std::vector<EventBatch> batches;
  while (true) {
    auto more = (*reader)->Next(&rec);
    ASSERT_TRUE(more.ok());
    if (!*more) break;
    auto b = DecodeBatch(rec.payload);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    batches.push_back(*b);
  }
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].events.size(), 2u);
  EXPECT_EQ(batches[0].data_parallel_rank, 0);
  ASSERT_EQ(batches[1].events.size(), 2u);  // eviction of 1, then the store of 3
  EXPECT_TRUE(std::holds_alternative<BlockRemoved>(batches[1].events[0]));
  EXPECT_EQ(std::get<BlockRemoved>(batches[1].events[0]).reason,
            RemovalReasonName(RemovalReason::kEvicted));

  auto fold = ReplayJournal(**journal);
  ASSERT_TRUE(fold.ok());
  EXPECT_EQ(fold->Hashes(kMediumCpu), (std::map<std::pair<int64_t, uint64_t>, int64_t>{
                                          {{0, K(2).Wire()}, 1}, {{0, K(3).Wire()}, 1}}));
  EXPECT_EQ(m->GetStats().event_batches_published, 2u);
  EXPECT_EQ(m->GetStats().events_published, 4u);
}

TEST(ManagerEventsTest, AJournaledPublisherJournalsBeforeSending) {
  kvo::testing::TempDir dir;
  JournalOptions jo;
  jo.dir = dir.path() + "/journal";
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok());
  KvEventsConfig c;
  c.enable_kv_cache_events = true;
  c.publisher = "zmq";
  c.endpoint = "ipc://" + dir.path() + "/pub";
  c.topic = "kv";
  PublisherOptions po;
  po.journal = journal->get();
  auto pub = CreateEventPublisher(c, 0, po);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  auto m = Make(2, false, nullptr, pub->get());
  StoreAll(*m, {K(1)});
  ASSERT_TRUE(m->PublishEvents().ok());
  StoreAll(*m, {K(2), K(3)});
  ASSERT_TRUE(m->PublishEvents().ok());
  (*pub)->Flush();
  auto fold = ReplayJournal(**journal);
  ASSERT_TRUE(fold.ok()) << fold.status().ToString();
  EXPECT_EQ(fold->batches(), 2u);
  EXPECT_EQ(fold->Hashes(kMediumCpu).size(), 2u);
  (*pub)->Shutdown();
}

}  // namespace
}  // namespace kvo
