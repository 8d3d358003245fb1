#include "transfer/kv_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvo {
namespace {

// Two tensors (K and V of one layer) of 8 blocks, 256-byte stride, 192-byte pages, 128 bytes
// copied for group 0 and all 192 for group 1 of tensor 1.
KvLayoutSpec TwoTensorSpec(uintptr_t base0, uintptr_t base1) {
  KvLayoutSpec s;
  s.tensors = {{base0, 8, 256, 192}, {base1, 8, 256, 192}};
  s.groups = {{{{0, 128}, {1, 128}}}, {{{1, 192}}}};
  s.blocks_per_chunk = 2;
  s.num_workers = 2;
  s.worker_index = 1;
  return s;
}

TEST(KvLayoutTest, RowGeometryFollowsVllm) {
  auto layout = KvLayout::Create(TwoTensorSpec(0x10000, 0x20000));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  // cell = (192 + 192) * 2 = 768; chunk = 1536 for two workers; row rounded up to 4096.
  EXPECT_EQ(layout->cell_bytes(), 768u);
  EXPECT_EQ(layout->kv_bytes_per_chunk(), 1536u);
  EXPECT_EQ(layout->row_stride(), 4096u);
  EXPECT_EQ(layout->TensorAreaOffset(0), 768u);         // worker 1's cell
  EXPECT_EQ(layout->TensorAreaOffset(1), 768u + 384u);  // after tensor 0's two pages
}

TEST(KvLayoutTest, ExpandsBlocksWithPartialFirstAndLastChunk) {
  auto layout = KvLayout::Create(TwoTensorSpec(0x10000, 0x20000));
  ASSERT_TRUE(layout.ok());
  HostRegion region{0x100000, 4, 4096};
  BlockTransferSpec spec;
  // Group 0: blocks 5,6,7 starting at logical index 3 -> skip 1: positions 1,2,3 -> slots a,b.
  // Group 1: block 2 at logical index 0 -> position 0 -> one slot.
  spec.gpu_block_ids = {5, 6, 7, 2};
  spec.group_sizes = {3, 1};
  spec.block_indices = {3, 0};
  spec.cpu_slots = {2, 0, 3};
  std::vector<CopySegment> segs;
  ASSERT_TRUE(
      layout->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, false, &segs).ok());
  const uintptr_t row2 = 0x100000 + 2 * 4096, row0 = 0x100000, row3 = 0x100000 + 3 * 4096;
  std::vector<CopySegment> want = {
      // group 0, tensor 0 (area 768): pos 1 in slot 2, pos 2,3 in slot 0 (sub 0, 1)
      {0x10000 + 5 * 256, row2 + 768 + 192, 128},
      {0x10000 + 6 * 256, row0 + 768 + 0, 128},
      {0x10000 + 7 * 256, row0 + 768 + 192, 128},
      // group 0, tensor 1 (area 768 + 384)
      {0x20000 + 5 * 256, row2 + 1152 + 192, 128},
      {0x20000 + 6 * 256, row0 + 1152 + 0, 128},
      {0x20000 + 7 * 256, row0 + 1152 + 192, 128},
      // group 1, tensor 1, full page
      {0x20000 + 2 * 256, row3 + 1152, 192},
  };
  EXPECT_EQ(segs, want);

  std::vector<CopySegment> back;
  ASSERT_TRUE(
      layout->ExpandBlockSpec(spec, region, TransferDirection::kCpuToGpu, false, &back).ok());
  ASSERT_EQ(back.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(back[i].src, want[i].dst);
    EXPECT_EQ(back[i].dst, want[i].src);
  }
}

TEST(KvLayoutTest, CoalescesContiguousPages) {
  KvLayoutSpec s;
  s.tensors = {{0x10000, 16, 4096, 4096}};
  s.groups = {{{{0, 4096}}}};
  s.blocks_per_chunk = 4;
  auto layout = KvLayout::Create(s);
  ASSERT_TRUE(layout.ok());
  HostRegion region{0x200000, 2, layout->row_stride()};
  BlockTransferSpec spec{{4, 5, 6, 7}, {4}, {}, {1}};
  std::vector<CopySegment> segs;
  ASSERT_TRUE(
      layout->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, true, &segs).ok());
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0], (CopySegment{0x10000 + 4 * 4096, 0x200000 + 16384, 16384}));
}

TEST(KvLayoutTest, RejectsLayoutsThatDoNotFit) {
  auto bad = [](auto mutate) {
    KvLayoutSpec s = TwoTensorSpec(0x10000, 0x20000);
    mutate(s);
    return KvLayout::Create(s).status();
  };
  EXPECT_EQ(bad([](KvLayoutSpec& s) { s.tensors.clear(); }).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.tensors[1].page_bytes = 0; }).message().find("tensor 1"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.tensors[0].page_bytes = 512; })
                .message()
                .find("exceeds block_stride"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.groups[1].refs[0].copy_bytes = 300; })
                .message()
                .find("group 1 ref 0"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.groups[0].refs[0].tensor_index = 7; })
                .message()
                .find("names tensor 7"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) {
              s.alignment = 16;
              s.tensors[0].base += 8;
            })
                .message()
                .find("not aligned"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.worker_index = 2; }).message().find("worker_index"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.blocks_per_chunk = 0; }).message().find("blocks_per_chunk"),
            std::string::npos);
  EXPECT_NE(bad([](KvLayoutSpec& s) { s.tensors[0].num_blocks = UINT64_MAX / 2; })
                .message()
                .find("address space"),
            std::string::npos);
}

TEST(KvLayoutTest, RejectsSpecsOutOfRange) {
  auto layout = KvLayout::Create(TwoTensorSpec(0x10000, 0x20000));
  ASSERT_TRUE(layout.ok());
  HostRegion region{0x100000, 4, 4096};
  std::vector<CopySegment> segs;
  auto expand = [&](BlockTransferSpec spec) {
    segs.clear();
    Status s = layout->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, true, &segs);
    EXPECT_TRUE(segs.empty());
    return s;
  };
  Status s = expand({{1}, {1, 0}, {}, {4}});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("CPU slot 4"), std::string::npos);
  s = expand({{1}, {1, 0}, {}, {-1}});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  s = expand({{8}, {1, 0}, {}, {0}});
  EXPECT_NE(s.message().find("GPU block 8"), std::string::npos);
  s = expand({{1, 2}, {1, 0}, {}, {0}});
  EXPECT_NE(s.message().find("2 block ids"), std::string::npos);
  s = expand({{1, 2, 3}, {3, 0}, {}, {0}});  // 3 blocks of 2 per chunk need 2 slots
  EXPECT_NE(s.message().find("need 2 CPU slots"), std::string::npos);
  s = expand({{1}, {1}, {}, {0}});
  EXPECT_NE(s.message().find("1 group sizes for 2 KV groups"), std::string::npos);
  HostRegion wrong{0x100000, 4, 8192};
  EXPECT_FALSE(layout
                   ->ExpandBlockSpec({{1}, {1, 0}, {}, {0}}, wrong, TransferDirection::kGpuToCpu,
                                     true, &segs)
                   .ok());
}

TEST(KvLayoutTest, ValidatesRawSegments) {
  std::vector<CopySegment> ok = {{0x1000, 0x2000, 64}};
  EXPECT_TRUE(ValidateSegments(ok, 16).ok());
  std::vector<CopySegment> zero = {{0x1000, 0x2000, 64}, {0x1000, 0x2000, 0}};
  EXPECT_NE(ValidateSegments(zero, 1).message().find("segment 1"), std::string::npos);
  std::vector<CopySegment> misaligned = {{0x1001, 0x2000, 64}};
  EXPECT_FALSE(ValidateSegments(misaligned, 16).ok());
  std::vector<CopySegment> wrap = {{UINTPTR_MAX - 8, 0x2000, 64}};
  EXPECT_FALSE(ValidateSegments(wrap, 1).ok());
  Status misaligned_status = ValidateSegments(misaligned, 16);
  EXPECT_EQ(misaligned_status.message(), "segment 0 not aligned to 16 bytes");
}

// Coalescing from an index on leaves the segments before it alone (ExpandBlockSpec appends a
// job's segments to what the caller already holds and coalesces only its own).
TEST(KvLayoutTest, CoalescesOnlyFromTheFirstIndexGiven) {
  std::vector<CopySegment> segs = {{0x1000, 0x9000, 64},
                                   {0x1040, 0x9040, 64},  // contiguous, kept apart
                                   {0x2000, 0xa000, 64},
                                   {0x2040, 0xa040, 64},
                                   {0x3000, 0xb000, 32}};  // first two merge
  CoalesceSegments(&segs, 2);
  std::vector<CopySegment> want = {
      {0x1000, 0x9000, 64}, {0x1040, 0x9040, 64}, {0x2000, 0xa000, 128}, {0x3000, 0xb000, 32}};
  EXPECT_EQ(segs, want);
  CoalesceSegments(&segs);
  want = {{0x1000, 0x9000, 128}, {0x2000, 0xa000, 128}, {0x3000, 0xb000, 32}};
  EXPECT_EQ(segs, want);
  CoalesceSegments(&segs, 10);  // past the end: nothing to do
  EXPECT_EQ(segs.size(), 3u);
}

}  // namespace
}  // namespace kvo
