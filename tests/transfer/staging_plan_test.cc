// The CUDA staging method's host-side planning (transfer/staging_plan.h) and the host-row
// expansion order it relies on, on CPU memory: plans are executed with memcpy (gather into the
// staging slot, then the host runs; or the reverse) and every byte is compared.
#include "transfer/staging_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "transfer/kv_layout.h"

namespace kvo {
namespace {

uintptr_t HostOf(const CopySegment& s, bool d2h) { return d2h ? s.dst : s.src; }

std::vector<CopySegment> Sorted(std::vector<CopySegment> v) {
  std::sort(v.begin(), v.end(), [](const CopySegment& a, const CopySegment& b) {
    return a.src != b.src ? a.src < b.src : a.dst < b.dst;
  });
  return v;
}

// Two tensors, two groups, 2 blocks per chunk, worker 1 of 2 (as kv_layout_test's).
KvLayoutSpec TwoTensorSpec() {
  KvLayoutSpec s;
  s.tensors = {{0x10000, 8, 256, 192}, {0x20000, 8, 256, 192}};
  s.groups = {{{{1, 128}, {0, 128}}}, {{{1, 192}}}};  // group 0 names tensor 1 first
  s.blocks_per_chunk = 2;
  s.num_workers = 2;
  s.worker_index = 1;
  return s;
}

TEST(ExpandOrderTest, HostRowEmitsEachRowInHostOrder) {
  auto layout = KvLayout::Create(TwoTensorSpec());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  HostRegion region{0x100000, 4, 4096};
  BlockTransferSpec spec{{5, 6, 7, 2}, {3, 1}, {3, 0}, {2, 0, 3}};
  std::vector<CopySegment> rows, refs;
  ASSERT_TRUE(layout
                  ->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, false, &rows,
                                    ExpandOrder::kHostRow)
                  .ok());
  ASSERT_TRUE(
      layout->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, false, &refs).ok());
  const uintptr_t row2 = 0x100000 + 2 * 4096, row0 = 0x100000, row3 = 0x100000 + 3 * 4096;
  // Group 0: chunk 0 (slot 2) holds position 1; chunk 1 (slot 0) positions 2, 3. Tensor 0's
  // area (768) before tensor 1's (1152) although the group names tensor 1 first.
  std::vector<CopySegment> want = {
      {0x10000 + 5 * 256, row2 + 768 + 192, 128}, {0x20000 + 5 * 256, row2 + 1152 + 192, 128},
      {0x10000 + 6 * 256, row0 + 768, 128},       {0x10000 + 7 * 256, row0 + 768 + 192, 128},
      {0x20000 + 6 * 256, row0 + 1152, 128},      {0x20000 + 7 * 256, row0 + 1152 + 192, 128},
      {0x20000 + 2 * 256, row3 + 1152, 192},
  };
  EXPECT_EQ(rows, want);
  EXPECT_EQ(Sorted(rows), Sorted(refs));  // the same segments in another order

  // A block outside its tensor: the same error, nothing appended.
  std::vector<CopySegment> out = {{1, 2, 3}};
  BlockTransferSpec bad{{5, 6, 8, 2}, {3, 1}, {3, 0}, {2, 0, 3}};
  Status st = layout->ExpandBlockSpec(bad, region, TransferDirection::kCpuToGpu, true, &out,
                                      ExpandOrder::kHostRow);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("GPU block 8"), std::string::npos) << st.ToString();
  EXPECT_EQ(out.size(), 1u);
}

// Random layouts and specs: both orders give the same segments; with ascending slots the host-row
// order is already host-ordered (OrderByHost moves nothing).
TEST(ExpandOrderTest, RandomSpecsSameSegmentsAndAscendingRows) {
  const uint32_t seed = 20261202;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " iter " + std::to_string(iter));
    KvLayoutSpec s;
    const uint32_t tensors = 1 + rng() % 6, groups = 1 + rng() % 3;
    const uint64_t page = 16 * (1 + rng() % 16);
    for (uint32_t t = 0; t < tensors; ++t) {
      s.tensors.push_back({0x1000000 + t * 0x100000, 64, page + 16 * (rng() % 3), page});
    }
    for (uint32_t g = 0; g < groups; ++g) {
      KvGroupLayout gl;
      std::vector<uint32_t> ts(tensors);
      std::iota(ts.begin(), ts.end(), 0);
      std::shuffle(ts.begin(), ts.end(), rng);
      for (uint32_t i = 0; i < 1 + rng() % tensors; ++i) gl.refs.push_back({ts[i], page});
      s.groups.push_back(gl);
    }
    s.blocks_per_chunk = 1 + rng() % 4;
    auto layout = KvLayout::Create(s);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    HostRegion region{0x40000000, 256, layout->row_stride()};
    BlockTransferSpec spec;
    uint64_t slots = 0;
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t n = rng() % 12;
      const uint64_t index = rng() % 8;
      spec.group_sizes.push_back(n);
      spec.block_indices.push_back(index);
      for (uint32_t i = 0; i < n; ++i) spec.gpu_block_ids.push_back(rng() % 64);
      slots += layout->SlotsForGroup(n, index);
    }
    for (uint64_t i = 0; i < slots; ++i) spec.cpu_slots.push_back(static_cast<int64_t>(i));
    const bool coalesce = rng() % 2 == 0;
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      std::vector<CopySegment> rows, refs;
      ASSERT_TRUE(
          layout->ExpandBlockSpec(spec, region, dir, false, &rows, ExpandOrder::kHostRow).ok());
      ASSERT_TRUE(layout->ExpandBlockSpec(spec, region, dir, false, &refs).ok());
      EXPECT_EQ(Sorted(rows), Sorted(refs));
      if (coalesce) CoalesceSegments(&rows);
      const std::vector<CopySegment> before = rows;
      HostOrderScratch scratch;
      const bool d2h = dir == TransferDirection::kGpuToCpu;
      ASSERT_TRUE(OrderByHost(&rows, d2h, &scratch).ok());
      EXPECT_EQ(rows, before);  // ascending slots: already in host order, left as they are
      for (size_t i = 1; i < rows.size(); ++i) {
        EXPECT_GE(HostOf(rows[i], d2h), HostOf(rows[i - 1], d2h) + rows[i - 1].bytes);
      }
    }
  }
}

TEST(OrderByHostTest, SortsSpansAndKeepsContiguousRunsTogether) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 100; ++iter) {
    SCOPED_TRACE("seed 77 iter " + std::to_string(iter));
    // Host ranges laid out back to back in random order with random gaps.
    const size_t n = 1 + rng() % 300;
    std::vector<CopySegment> segs(n);
    uintptr_t host = 0x10000000;
    for (size_t i = 0; i < n; ++i) {
      segs[i].bytes = 16 * (1 + rng() % 64);
      if (rng() % 3 == 0) host += 16 * (rng() % 4);
      segs[i].dst = host;
      segs[i].src = 0x90000000 + i * 0x10000;
      host += segs[i].bytes;
    }
    // Shuffle blocks of consecutive segments (spans move as units or are split).
    std::vector<CopySegment> in;
    std::vector<size_t> cut = {0, n};
    for (int c = 0; c < 8; ++c) cut.push_back(rng() % n);
    std::sort(cut.begin(), cut.end());
    cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
    std::vector<std::pair<size_t, size_t>> pieces;
    for (size_t i = 0; i + 1 < cut.size(); ++i) pieces.push_back({cut[i], cut[i + 1]});
    std::shuffle(pieces.begin(), pieces.end(), rng);
    for (auto [a, b] : pieces) in.insert(in.end(), segs.begin() + a, segs.begin() + b);
    for (bool d2h : {true, false}) {
      std::vector<CopySegment> v = in;
      if (!d2h) {
        for (auto& s : v) std::swap(s.src, s.dst);
      }
      HostOrderScratch scratch;
      auto spans = OrderByHost(&v, d2h, &scratch);
      ASSERT_TRUE(spans.ok());
      EXPECT_GE(*spans, 1u);
      ASSERT_EQ(v.size(), n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(HostOf(v[i], d2h), segs[i].dst) << i;  // exactly host order
        EXPECT_EQ(v[i].bytes, segs[i].bytes);
      }
    }
  }
}

// Executes a plan on CPU memory and compares every byte: random segments, chunk and piece sizes.
TEST(StagingPlannerTest, PlansExecuteByteExactAndStayInBounds) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  StagingPlanner planner;  // reused across jobs, as the engine does
  uint64_t next_slot = 0;
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("seed 4242 iter " + std::to_string(iter));
    const bool d2h = rng() % 2 == 0;
    const size_t n = 1 + rng() % 400;
    std::vector<uint64_t> sizes(n);
    uint64_t total = 0;
    for (auto& b : sizes) {
      b = rng() % 4 == 0 ? 1 + rng() % 9000 : 16 * (1 + rng() % 512);  // some unaligned
      total += b;
    }
    std::vector<uint8_t> gpu(total), host(total + 16 * n, 0), want(host.size(), 0);
    const uint32_t salt = rng();
    for (size_t i = 0; i < gpu.size(); ++i) gpu[i] = static_cast<uint8_t>((i * 131 + salt) >> 3);
    // Segment i: gpu bytes at a shuffled position, host at ascending positions with gaps.
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint64_t> gpu_off(n);
    uint64_t off = 0;
    for (size_t i : order) {
      gpu_off[i] = off;
      off += sizes[i];
    }
    std::vector<CopySegment> segs;
    uint64_t hoff = 0;
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 4 == 0) hoff += 16;
      const uintptr_t g = reinterpret_cast<uintptr_t>(gpu.data() + gpu_off[i]);
      const uintptr_t h = reinterpret_cast<uintptr_t>(host.data() + hoff);
      std::memcpy(want.data() + hoff, gpu.data() + gpu_off[i], sizes[i]);
      segs.push_back(d2h ? CopySegment{g, h, sizes[i]} : CopySegment{h, g, sizes[i]});
      hoff += sizes[i];
    }
    std::shuffle(segs.begin(), segs.end(), rng);
    HostOrderScratch scratch;
    ASSERT_TRUE(OrderByHost(&segs, d2h, &scratch).ok());

    StagingPlanner::Params p;
    p.chunk_bytes = (1 + rng() % 4) << 15;  // 32-128 KiB: many chunks per job
    p.piece_bytes = 16 * (1 + rng() % 512);
    std::vector<uint8_t> stage0(p.chunk_bytes), stage1(p.chunk_bytes);
    p.staging = {reinterpret_cast<uintptr_t>(stage0.data()),
                 reinterpret_cast<uintptr_t>(stage1.data())};
    p.first_slot = next_slot;
    p.d2h = d2h;
    const size_t max = StagingPlanner::MaxDescs(segs, total, p);
    std::vector<PieceDesc> descs(max + 1, PieceDesc{0, 0, 0, 0xdead});
    planner.Begin(segs, total, p, descs.data(), max);
    // H2D: the "GPU" side starts zeroed and must end up equal to the original bytes.
    std::vector<uint8_t> gpu_before = gpu;
    if (!d2h) {
      std::memcpy(host.data(), want.data(), host.size());
      std::fill(gpu.begin(), gpu.end(), 0);
    }
    StagingChunk c;
    size_t chunks = 0;
    uint64_t planned = 0;
    while (planner.Next(&c)) {
      EXPECT_EQ(c.slot, (next_slot + chunks) % 2);
      ++chunks;
      const uintptr_t stage = p.staging[c.slot];
      uint64_t fill = 0;
      for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
        const PieceDesc& d = descs[i];
        ASSERT_LE(d.bytes, p.piece_bytes);
        ASSERT_GT(d.bytes, 0u);
        EXPECT_EQ((d2h ? d.dst : d.src) - stage, fill);  // staging filled back to back
        fill += d.bytes;
      }
      ASSERT_LE(fill, p.chunk_bytes);
      if (chunks == 1 && total > p.chunk_bytes / 8) {
        EXPECT_EQ(fill, p.chunk_bytes / 8);  // the short first chunk
      }
      uint64_t run_bytes = 0;
      for (const StagingRun& r : planner.runs()) run_bytes += r.bytes;
      EXPECT_EQ(run_bytes, fill);
      auto run_descs = [&] {
        for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
          std::memcpy(reinterpret_cast<void*>(descs[i].dst),
                      reinterpret_cast<const void*>(descs[i].src), descs[i].bytes);
        }
      };
      if (d2h) {
        run_descs();
        for (const StagingRun& r : planner.runs()) {
          std::memcpy(reinterpret_cast<void*>(r.host),
                      reinterpret_cast<const void*>(stage + r.offset), r.bytes);
        }
      } else {
        for (const StagingRun& r : planner.runs()) {
          std::memcpy(reinterpret_cast<void*>(stage + r.offset),
                      reinterpret_cast<const void*>(r.host), r.bytes);
        }
        run_descs();
      }
      planned += fill;
    }
    next_slot += chunks;
    EXPECT_FALSE(planner.overflowed());
    EXPECT_EQ(planned, total);
    EXPECT_EQ(chunks, StagingPlanner::ChunkCount(total, p.chunk_bytes));
    EXPECT_LE(planner.descs_used(), max);
    EXPECT_EQ(descs[max].pad, 0xdeadu);  // nothing written past the capacity given
    if (d2h) {
      EXPECT_TRUE(host == want);
    } else {
      EXPECT_TRUE(gpu == gpu_before);
    }
  }
}

// A buffer below MaxDescs or a total above the segments' bytes is reported, never overrun.
TEST(StagingPlannerTest, ReportsOverflowInsteadOfWritingPastTheBuffer) {
  std::vector<CopySegment> segs = {{0x1000, 0x100000, 4096}, {0x9000, 0x200000, 4096}};
  StagingPlanner::Params p;
  p.chunk_bytes = 1 << 20;
  p.piece_bytes = 1024;
  p.staging = {0x7000000, 0x8000000};
  std::vector<PieceDesc> descs(5, PieceDesc{0, 0, 0, 7});
  StagingPlanner planner;
  planner.Begin(segs, 8192, p, descs.data(), 4);  // needs 8
  StagingChunk c;
  while (planner.Next(&c)) {
  }
  EXPECT_TRUE(planner.overflowed());
  EXPECT_EQ(descs[4].pad, 7u);
  std::vector<PieceDesc> more(10, PieceDesc{0, 0, 0, 7});
  planner.Begin(segs, 9000, p, more.data(), 9);  // claims more bytes than the segments hold
  while (planner.Next(&c)) {
  }
  EXPECT_TRUE(planner.overflowed());
  EXPECT_EQ(more[9].pad, 7u);
  EXPECT_EQ(StagingPlanner::MaxDescs(segs, 8192, p), 9u);
}

}  // namespace
}  // namespace kvo
