// `kvo bench manager`: lookups and stores through the real OffloadManager (LRU and ARC), beside a
// straightforward std::unordered_map + std::list LRU doing the same operations in the same run.
#include <malloc.h>

#include <list>
#include <random>
#include <unordered_map>

#include "bench/bench.h"
#include "manager/offload_manager.h"

namespace kvo::bench {
namespace {

// The baseline: the textbook LRU cache.
class SimpleLru {
 public:
  explicit SimpleLru(size_t capacity) : capacity_(capacity) { map_.reserve(capacity); }
  bool Lookup(const OffloadKey& k) { return map_.find(k) != map_.end(); }
  void Store(const OffloadKey& k) {
    auto it = map_.find(k);
    if (it != map_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    if (map_.size() >= capacity_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(k);
    map_.emplace(k, order_.begin());
  }

 private:
  size_t capacity_;
  std::list<OffloadKey> order_;
  std::unordered_map<OffloadKey, std::list<OffloadKey>::iterator, OffloadKeyHash> map_;
};

std::vector<OffloadKey> RandomKeys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<OffloadKey> keys;
  keys.reserve(n);
  std::string digest(32, '\0');
  for (size_t i = 0; i < n; ++i) {
    for (char& c : digest) c = static_cast<char>(rng());
    keys.push_back(OffloadKey::FromDigest(digest, 0));
  }
  return keys;
}

// Heap bytes in use, including the large blocks glibc maps directly (hblkhd).
size_t HeapInUse() {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

void RunPolicy(const std::string& policy, const BenchOptions& o) {
  const size_t capacity = o.quick ? 20000 : 200000;
  const size_t chunk = 16;
  std::vector<OffloadKey> stored = RandomKeys(capacity, 1);
  RequestContext ctx;

  // Fill the manager; memory per block = heap growth / blocks.
  size_t heap_before = HeapInUse();
  ManagerOptions mo;
  mo.num_blocks = capacity;
  mo.eviction_policy = policy;
  auto created = OffloadManager::Create(mo);
  if (!created.ok()) {
    std::fprintf(stderr, "kvo bench manager: %s\n", created.status().ToString().c_str());
    return;
  }
  std::unique_ptr<OffloadManager> m = std::move(created).value();
  for (size_t i = 0; i < capacity; i += chunk) {
    std::span<const OffloadKey> keys(stored.data() + i, std::min(chunk, capacity - i));
    auto out = m->PrepareStore(keys, ctx);
    if (out.ok() && *out) (void)m->CompleteStore((*out)->keys_to_store, ctx, true);
  }
  m->TakeEvents();
  double bytes_per_block = double(HeapInUse() - heap_before) / double(capacity);

  // Lookups of present keys, in a random order.
  std::vector<OffloadKey> probe = stored;
  std::shuffle(probe.begin(), probe.end(), std::mt19937_64(2));
  size_t pos = 0;
  double lookups = MeasureRate(
      [&] {
        for (int i = 0; i < 1024; ++i) {
          (void)m->Lookup(probe[pos], ctx);
          pos = pos + 1 == probe.size() ? 0 : pos + 1;
        }
      },
      1024, o.seconds_per_case);
  size_t simple_heap_before = HeapInUse();
  SimpleLru simple(capacity);
  for (const OffloadKey& k : stored) simple.Store(k);
  double simple_bytes_per_block = double(HeapInUse() - simple_heap_before) / double(capacity);
  pos = 0;
  double simple_lookups = MeasureRate(
      [&] {
        for (int i = 0; i < 1024; ++i) {
          (void)simple.Lookup(probe[pos]);
          pos = pos + 1 == probe.size() ? 0 : pos + 1;
        }
      },
      1024, o.seconds_per_case);
  PrintResult(
      {"manager", policy + "_lookup", "lookups/s", lookups, "std::unordered_map + std::list LRU",
       simple_lookups, 20e6, std::to_string(capacity) + " blocks present, random order"},
      o);

  // Stores under eviction pressure: every 16-key chunk is new and evicts 16 blocks; events on.
  std::vector<OffloadKey> fresh = RandomKeys(o.quick ? 200000 : 2000000, 3);
  size_t next = 0;
  uint64_t events = 0;
  double stores = MeasureRate(
      [&] {
        if (next + chunk > fresh.size()) next = 0;
        std::span<const OffloadKey> keys(fresh.data() + next, chunk);
        next += chunk;
        auto out = m->PrepareStore(keys, ctx);
        if (out.ok() && *out) (void)m->CompleteStore((*out)->keys_to_store, ctx, true);
        events += m->TakeEvents().size();
      },
      double(chunk), o.seconds_per_case);
  next = 0;
  double simple_stores = MeasureRate(
      [&] {
        if (next + chunk > fresh.size()) next = 0;
        for (size_t i = 0; i < chunk; ++i) simple.Store(fresh[next + i]);
        next += chunk;
      },
      double(chunk), o.seconds_per_case);
  PrintResult({"manager", policy + "_store_under_eviction", "blocks/s", stores,
               "std::unordered_map + std::list LRU", simple_stores, 5e6,
               "16-key chunks, each evicting 16; prepare_store + complete_store + take_events"},
              o);

  BenchResult mem{"manager",
                  policy + "_bytes_per_block",
                  "bytes",
                  bytes_per_block,
                  "std::unordered_map + std::list LRU holding the same keys",
                  simple_bytes_per_block,
                  0,
                  "heap growth / blocks after filling; lower is better; target <= 64"};
  mem.notes += bytes_per_block <= 64 ? " [target met]" : " [above target]";
  PrintResult(mem, o);
}

}  // namespace

int RunManagerBench(const BenchOptions& options) {
  for (const char* policy : {"lru", "arc"}) RunPolicy(policy, options);
  return 0;
}

}  // namespace kvo::bench
