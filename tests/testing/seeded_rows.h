// Host rows for file-tier tests: page-aligned, zeroed, each row fillable with bytes derived from a
// seed so that another process (or a later run) can check it without keeping the bytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "transfer/fs_block_store.h"

namespace kvo::testing {

struct SeededRows {
  explicit SeededRows(uint64_t n, uint64_t row) : num(n), stride(row) {
    mem = static_cast<uint8_t*>(std::aligned_alloc(4096, n * row));
    std::memset(mem, 0, n * row);
  }
  ~SeededRows() { std::free(mem); }
  SeededRows(const SeededRows&) = delete;
  SeededRows& operator=(const SeededRows&) = delete;

  HostRegion region() const { return {reinterpret_cast<uintptr_t>(mem), num, stride}; }
  uint8_t* row(uint64_t i) const { return mem + i * stride; }
  void Fill(uint64_t i, uint64_t seed) const { Generate(seed, row(i)); }
  bool Matches(uint64_t i, uint64_t seed) const {
    std::vector<uint8_t> want(stride);
    Generate(seed, want.data());
    return std::memcmp(want.data(), row(i), stride) == 0;
  }

  uint8_t* mem;
  uint64_t num;
  uint64_t stride;

 private:
  void Generate(uint64_t seed, uint8_t* out) const {
    std::mt19937_64 rng(seed);
    for (uint64_t w = 0; w < stride / 8; ++w) {
      const uint64_t v = rng();
      std::memcpy(out + w * 8, &v, 8);
    }
  }
};

}  // namespace kvo::testing
