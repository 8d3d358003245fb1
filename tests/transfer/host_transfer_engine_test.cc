#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "transfer/transfer.h"

namespace kvo {
namespace {

std::unique_ptr<TransferEngine> Engine(int threads, uint64_t min_split = 4096) {
  TransferEngineOptions o;
  o.num_threads = threads;
  o.min_split_bytes = min_split;
  auto e = MakeTransferEngine("host", o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

// A fake "GPU" KV cache in host memory: `layers` K and V tensors of `blocks` pages each.
struct FakeKv {
  std::vector<std::vector<uint8_t>> tensors;
  KvLayoutSpec spec;
  FakeKv(int layers, uint64_t blocks, uint64_t page, uint32_t bpc, std::mt19937_64* rng) {
    tensors.resize(static_cast<size_t>(layers) * 2);
    KvGroupLayout g;
    for (size_t t = 0; t < tensors.size(); ++t) {
      tensors[t].resize(blocks * page);
      for (auto& b : tensors[t]) b = static_cast<uint8_t>((*rng)());
      spec.tensors.push_back({reinterpret_cast<uintptr_t>(tensors[t].data()), blocks, page, page});
      g.refs.push_back({static_cast<uint32_t>(t), page});
    }
    spec.groups = {g};
    spec.blocks_per_chunk = bpc;
  }
};

TEST(HostTransferEngineTest, RoundTripsBlocksByteExact) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (uint32_t bpc : {1u, 2u, 4u}) {
    SCOPED_TRACE("blocks_per_chunk " + std::to_string(bpc));
    FakeKv kv(4, 32, 1024, bpc, &rng);
    auto layout = KvLayout::Create(kv.spec);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    auto engine = Engine(3);
    auto region = engine->AllocateHostRegion(16, layout->row_stride());
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE(engine->RegisterLayout(*layout, *region).ok());
    EXPECT_EQ(engine->RegisterLayout(*layout, *region).code(), StatusCode::kFailedPrecondition);

    // Offload blocks 3..10 (logical index 1: partial first chunk) into slots.
    BlockTransferSpec store;
    for (int64_t b = 3; b <= 10; ++b) store.gpu_block_ids.push_back(b);
    store.group_sizes = {8};
    store.block_indices = {1};
    const uint64_t nslots = layout->SlotsForGroup(8, 1);
    for (uint64_t i = 0; i < nslots; ++i) store.cpu_slots.push_back(static_cast<int64_t>(15 - i));
    auto sid = engine->Submit({TransferDirection::kGpuToCpu, {}, store, 0});
    ASSERT_TRUE(sid.ok()) << sid.status().ToString();
    ASSERT_TRUE(engine->Wait(*sid).ok());

    // Poison the GPU side, then load back into other blocks 20..27.
    std::vector<std::vector<uint8_t>> orig = kv.tensors;
    for (auto& t : kv.tensors) std::memset(t.data(), 0xAB, t.size());
    BlockTransferSpec load = store;
    for (size_t i = 0; i < load.gpu_block_ids.size(); ++i) {
      load.gpu_block_ids[i] = 20 + static_cast<int64_t>(i);
    }
    auto lid = engine->Submit({TransferDirection::kCpuToGpu, {}, load, 0});
    ASSERT_TRUE(lid.ok());
    ASSERT_TRUE(engine->Wait(*lid).ok());
    for (size_t t = 0; t < kv.tensors.size(); ++t) {
      for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(0, std::memcmp(kv.tensors[t].data() + (20 + i) * 1024,
                                 orig[t].data() + (3 + i) * 1024, 1024))
            << "tensor " << t << " block " << i;
      }
      // Blocks not loaded keep the poison.
      EXPECT_EQ(kv.tensors[t][0], 0xAB);
      EXPECT_EQ(kv.tensors[t][19 * 1024 + 5], 0xAB);
      EXPECT_EQ(kv.tensors[t][28 * 1024], 0xAB);
    }
    std::vector<TransferResult> done;
    engine->TakeFinished(&done);
    ASSERT_EQ(done.size(), 2u);
    for (const auto& r : done) {
      EXPECT_TRUE(r.success);
      EXPECT_EQ(r.bytes, 8u * 8 * 1024);
      EXPECT_GE(r.seconds, 0.0);
    }
    EXPECT_EQ(engine->Wait(*sid).code(), StatusCode::kNotFound);  // already returned
  }
}

TEST(HostTransferEngineTest, CompletesInOrderPerDirection) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  auto engine = Engine(4);
  std::vector<uint8_t> src(1 << 22), dst(1 << 22);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<JobId> ids[2];
  for (int i = 0; i < 64; ++i) {
    // Job i copies within its own 64 KiB slice: jobs of a direction may run at once (only their
    // completion is ordered), so overlapping destinations would be a race in this test.
    const uint64_t size = 1 + rng() % (1 << 16);
    const uint64_t off = uint64_t(i) * (1 << 16) + rng() % ((1 << 16) - size + 1);
    auto dir = (rng() & 1) ? TransferDirection::kGpuToCpu : TransferDirection::kCpuToGpu;
    TransferRequest req;
    req.direction = dir;
    req.segments = {{reinterpret_cast<uintptr_t>(src.data() + off),
                     reinterpret_cast<uintptr_t>(dst.data() + off), size}};
    auto id = engine->Submit(std::move(req));
    ASSERT_TRUE(id.ok());
    ids[static_cast<int>(dir)].push_back(*id);
  }
  // Poll while the jobs run (jobs finish out of order on 4 workers; results must not).
  std::vector<TransferResult> got;
  while (got.size() < 64) engine->TakeFinished(&got);
  std::vector<JobId> seen[2];
  for (const auto& r : got) seen[static_cast<int>(r.direction)].push_back(r.job_id);
  EXPECT_EQ(seen[0], ids[0]);
  EXPECT_EQ(seen[1], ids[1]);
}

TEST(HostTransferEngineTest, RejectsBadJobsWithoutSideEffects) {
  auto engine = Engine(2);
  EXPECT_EQ(engine->Submit({}).status().code(), StatusCode::kInvalidArgument);  // empty
  TransferRequest zero;
  zero.segments = {{0x1000, 0x2000, 0}};
  EXPECT_FALSE(engine->Submit(zero).ok());
  TransferRequest blocks;
  blocks.blocks = BlockTransferSpec{{0}, {1}, {}, {0}};
  EXPECT_EQ(engine->Submit(blocks).status().code(), StatusCode::kFailedPrecondition);

  std::vector<uint8_t> t(4 * 256);
  KvLayoutSpec spec;
  spec.tensors = {{reinterpret_cast<uintptr_t>(t.data()), 4, 256, 256}};
  spec.groups = {{{{0, 256}}}};
  auto layout = KvLayout::Create(spec);
  ASSERT_TRUE(layout.ok());
  auto region = engine->AllocateHostRegion(2, layout->row_stride());
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(engine->RegisterLayout(*layout, *region).ok());
  blocks.blocks = BlockTransferSpec{{0}, {1}, {}, {2}};  // slot out of range
  EXPECT_EQ(engine->Submit(blocks).status().code(), StatusCode::kOutOfRange);
  blocks.blocks = BlockTransferSpec{{4}, {1}, {}, {0}};  // block out of range
  EXPECT_EQ(engine->Submit(blocks).status().code(), StatusCode::kOutOfRange);
  std::vector<TransferResult> none;
  engine->TakeFinished(&none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(engine->Wait(12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(MakeTransferEngine("nope", {}).status().code(), StatusCode::kNotFound);
}

TEST(HostTransferEngineTest, SplitsLargeCopiesAcrossWorkers) {
  auto engine = Engine(4, 4096);
  std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  TransferRequest req;
  req.segments = {{reinterpret_cast<uintptr_t>(src.data()), reinterpret_cast<uintptr_t>(dst.data()),
                   src.size() - 5}};
  auto id = engine->Submit(req);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(engine->Wait(*id).ok());
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size() - 5));
  EXPECT_EQ(dst[src.size() - 1], 0);
}

}  // namespace
}  // namespace kvo
