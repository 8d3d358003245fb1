// FlatTable<V>: an open-addressing hash table from uint64_t keys to a small trivially copyable V
// (linear probing, 16-byte slots for V <= 8 bytes, backward-shift deletion, load <= 0.8).
// Built for the scoring walk: Find() touches one or two cache lines, Prefetch() lets the caller
// overlap the DRAM misses of upcoming keys. Internal to kvo_indexer. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvo::indexer_internal {

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
    std::vector<Slot> old;
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

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
  bool has_special_ = false;
  V special_{};
};

}  // namespace kvo::indexer_internal
