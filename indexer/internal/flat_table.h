// FlatTable<V>: an open-addressing hash table from uint64_t keys to a small trivially copyable V
// (linear probing, 16-byte slots for V <= 8 bytes, backward-shift deletion, load <= 0.8).
// Built for the scoring walk: Find() touches one or two cache lines, Prefetch() lets the caller
// overlap the DRAM misses of upcoming keys. Internal to kvo_indexer. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include <sys/mman.h>

namespace kvo::indexer_internal {

// Big tables (4 MiB and up) in memory the kernel may back with 2 MiB pages (MADV_HUGEPAGE, asked
// before the first touch): a lookup in a table of millions of slots misses the TLB as well as the
// cache with 4 KiB pages, and the page walk is what a prefetch hides worst (the router bench's
// by-hash walk: ~146 -> ~131 us). Smaller blocks come from operator new; the size alone decides
// which, so deallocate frees each block the way it was taken.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t{2} << 20;
  static constexpr size_t kMinBytes = size_t{4} << 20;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  static bool Big(size_t n) { return n * sizeof(T) >= kMinBytes; }
  static size_t Rounded(size_t n) { return (n * sizeof(T) + kHuge - 1) & ~(kHuge - 1); }
  T* allocate(size_t n) {
    if (!Big(n)) return std::allocator<T>().allocate(n);
    if (n > SIZE_MAX / sizeof(T) - 2 * kHuge) throw std::bad_alloc();
    const size_t size = Rounded(n);
    void* m =
        mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    // Keep the 2 MiB-aligned `size` bytes inside the mapping; unmap the head and the tail.
    const uintptr_t b = reinterpret_cast<uintptr_t>(m);
    const uintptr_t lo = (b + kHuge - 1) & ~(uintptr_t{kHuge} - 1);
    if (lo > b) munmap(m, lo - b);
    if (b + kHuge > lo) munmap(reinterpret_cast<void*>(lo + size), b + kHuge - lo);
    madvise(reinterpret_cast<void*>(lo), size, MADV_HUGEPAGE);  // advice: failure is harmless
    return reinterpret_cast<T*>(lo);
  }
  void deallocate(T* p, size_t n) {
    if (!Big(n)) {
      std::allocator<T>().deallocate(p, n);
      return;
    }
    munmap(p, Rounded(n));
  }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
};

template <class V>
class FlatTable {
 public:
  FlatTable() { Rehash(16); }

  // nullptr when absent.
  const V* Find(uint64_t key) const {
    if (key == kEmpty) return has_special_ ? &special_ : nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  V* FindMutable(uint64_t key) {
    return const_cast<V*>(static_cast<const FlatTable*>(this)->Find(key));
  }

  void Prefetch(uint64_t key) const { __builtin_prefetch(&slots_[Home(key)]); }

  // Inserts or overwrites; returns the stored value.
  V* Insert(uint64_t key, V value) {
    if (key == kEmpty) {
      if (!has_special_) ++size_;
      has_special_ = true;
      special_ = value;
      return &special_;
    }
    if ((size_ + 1) * 5 > slots_.size() * 4) Rehash(slots_.size() * 2);
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) {
        s.value = value;
        return &s.value;
      }
      if (s.key == kEmpty) {
        s.key = key;
        s.value = value;
        ++size_;
        return &s.value;
      }
    }
  }

  bool Erase(uint64_t key) {
    if (key == kEmpty) {
      if (!has_special_) return false;
      has_special_ = false;
      --size_;
      return true;
    }
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == kEmpty) return false;
    }
    // Backward-shift: move later members of the probe run into the hole.
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      const size_t home = Home(slots_[j].key);
      // Movable when its home is not in (hole, j] cyclically.
      const bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = kEmpty;
    --size_;
    return true;
  }

  template <class F>
  void ForEach(F&& f) const {
    if (has_special_) f(kEmpty, special_);
    for (const Slot& s : slots_) {
      if (s.key != kEmpty) f(s.key, s.value);
    }
  }

  // The members stored in slots [begin, end) (capacity() slots in all; the key kEmpty, kept
  // aside, is visited with begin == 0). For incremental scans: an Erase or a rehash between two
  // calls may move members across the cursor, so such a scan is repeated until it finds nothing.
  template <class F>
  void ForEachInSlots(size_t begin, size_t end, F&& f) const {
    if (begin == 0 && has_special_) f(kEmpty, special_);
    for (size_t i = begin; i < end && i < slots_.size(); ++i) {
      if (slots_[i].key != kEmpty) f(slots_[i].key, slots_[i].value);
    }
  }
  size_t capacity() const { return slots_.size(); }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }
  static constexpr size_t kSlotBytes = sizeof(uint64_t) + (sizeof(V) <= 8 ? 8 : sizeof(V));

  void Clear() {
    Rehash(16);
    size_ = 0;
    has_special_ = false;
  }

 private:
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Slot {
    uint64_t key = kEmpty;
    V value{};
  };

  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }

  void Rehash(size_t capacity) {
    std::vector<Slot, HugePageAllocator<Slot>> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    int bits = 0;
    while ((size_t{1} << bits) < capacity) ++bits;
    shift_ = 64 - bits;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      for (size_t i = Home(s.key);; i = (i + 1) & mask_) {
        if (slots_[i].key == kEmpty) {
          slots_[i] = s;
          break;
        }
      }
    }
  }

  std::vector<Slot, HugePageAllocator<Slot>> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
  bool has_special_ = false;
  V special_{};
};

}  // namespace kvo::indexer_internal
