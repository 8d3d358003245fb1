// CachePolicyRegistry: vLLM's CachePolicyFactory behaviours (tests/v1/kv_offload/cpu/policies/
// test_factory.py): built-ins, registering and resolving a custom policy, the unknown-name and
// duplicate errors; plus concurrent use.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "manager/arc_policy.h"
#include "manager/cache_policy.h"
#include "manager/lru_policy.h"
#include "tests/manager/policy_test_util.h"

namespace kvo {
namespace {

// A policy that holds nothing, like vLLM's _DummyCachePolicy.
class DummyPolicy final : public CachePolicy {
 public:
  explicit DummyPolicy(size_t capacity) : capacity_(capacity) {}
  BlockStatus* Get(const OffloadKey&) override { return nullptr; }
  void Insert(const OffloadKey&, BlockStatus) override {}
  void Remove(const OffloadKey&) override {}
  void Touch(std::span<const OffloadKey>) override {}
  std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> Evict(
      size_t, std::span<const OffloadKey>) override {
    return std::nullopt;
  }
  void Clear() override {}
  void MarkEvictable(const OffloadKey&) override {}
  void MarkNonEvictable(const OffloadKey&) override {}
  size_t size() const override { return 0; }
  size_t num_evictable() const override { return 0; }
  Status CheckInvariants() const override { return Status::Ok(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
};

CachePolicyFactory DummyFactory() {
  return [](size_t capacity) { return std::make_unique<DummyPolicy>(capacity); };
}

TEST(CachePolicyRegistryTest, LruAndArcAreBuiltIn) {
  CachePolicyRegistry registry;
  EXPECT_EQ(registry.Names(), (std::vector<std::string>{"arc", "lru"}));
  auto lru = registry.Create("lru", 4);
  ASSERT_TRUE(lru.ok()) << lru.status().ToString();
  EXPECT_NE(dynamic_cast<LruPolicy*>(lru->get()), nullptr);
  auto arc = registry.Create("arc", 4);
  ASSERT_TRUE(arc.ok()) << arc.status().ToString();
  auto* arc_policy = dynamic_cast<ArcPolicy*>(arc->get());
  ASSERT_NE(arc_policy, nullptr);
  EXPECT_EQ(arc_policy->capacity(), 4u);

  // The registry's ARC has the #55461 fallback on.
  (*arc)->Insert(policy_test::Key(1), policy_test::Ready(0));
  arc_policy->set_target_t1_size_for_testing(4);
  EXPECT_TRUE((*arc)->Evict(1, {}).has_value());
}

TEST(CachePolicyRegistryTest, GlobalHasTheBuiltIns) {
  auto names = CachePolicyRegistry::Global().Names();
  EXPECT_NE(std::find(names.begin(), names.end(), "lru"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "arc"), names.end());
  EXPECT_EQ(&CachePolicyRegistry::Global(), &CachePolicyRegistry::Global());
  EXPECT_TRUE(CachePolicyRegistry::Global().Create("lru", 0).ok());
}

TEST(CachePolicyRegistryTest, RegisterAndResolveACustomPolicy) {
  CachePolicyRegistry registry;
  ASSERT_TRUE(registry.Register("dummy", DummyFactory()).ok());
  EXPECT_EQ(registry.Names(), (std::vector<std::string>{"arc", "dummy", "lru"}));
  auto p = registry.Create("dummy", 7);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* dummy = dynamic_cast<DummyPolicy*>(p->get());
  ASSERT_NE(dummy, nullptr);
  EXPECT_EQ(dummy->capacity(), 7u);
}

TEST(CachePolicyRegistryTest, UnknownPolicyIsInvalidArgumentNamingTheSupportedOnes) {
  CachePolicyRegistry registry;
  auto p = registry.Create("nonexistent", 4);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "Unknown cache policy: 'nonexistent'. Supported: ['arc', 'lru']. For an out-of-tree "
            "policy, register it with CachePolicyRegistry.");
  // Names are quoted like Python's repr().
  EXPECT_EQ(registry.Create("it's", 1).status().message().substr(0, 28),
            "Unknown cache policy: \"it's\"");
  EXPECT_EQ(registry.Create("", 1).status().message().substr(0, 25), "Unknown cache policy: ''.");
}

TEST(CachePolicyRegistryTest, DuplicateRegistrationIsAlreadyExists) {
  CachePolicyRegistry registry;
  Status s = registry.Register("lru", DummyFactory());
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), "Cache policy 'lru' is already registered.");
  ASSERT_TRUE(registry.Register("dummy", DummyFactory()).ok());
  EXPECT_EQ(registry.Register("dummy", DummyFactory()).code(), StatusCode::kAlreadyExists);
  // The built-in is still the original.
  auto p = registry.Create("lru", 1);
  ASSERT_TRUE(p.ok());
  EXPECT_NE(dynamic_cast<LruPolicy*>(p->get()), nullptr);
}

TEST(CachePolicyRegistryTest, EmptyFactoryOrNullPolicyIsAnError) {
  CachePolicyRegistry registry;
  EXPECT_EQ(registry.Register("empty", CachePolicyFactory()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Create("empty", 1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.Register("null", [](size_t) { return nullptr; }).ok());
  EXPECT_EQ(registry.Create("null", 1).status().code(), StatusCode::kInternal);
}

TEST(CachePolicyRegistryTest, RegistriesAreIndependent) {
  CachePolicyRegistry a;
  CachePolicyRegistry b;
  ASSERT_TRUE(a.Register("dummy", DummyFactory()).ok());
  EXPECT_TRUE(a.Create("dummy", 1).ok());
  EXPECT_FALSE(b.Create("dummy", 1).ok());
}

// Factories may use the registry themselves: Create calls them without the lock held.
TEST(CachePolicyRegistryTest, FactoryMayReenterTheRegistry) {
  CachePolicyRegistry registry;
  ASSERT_TRUE(registry
                  .Register("alias",
                            [&registry](size_t capacity) -> std::unique_ptr<CachePolicy> {
                              auto p = registry.Create("arc", capacity);
                              return p.ok() ? std::move(p).value() : nullptr;
                            })
                  .ok());
  auto p = registry.Create("alias", 3);
  ASSERT_TRUE(p.ok());
  EXPECT_NE(dynamic_cast<ArcPolicy*>(p->get()), nullptr);
}

TEST(CachePolicyRegistryTest, ConcurrentRegisterAndCreate) {
  CachePolicyRegistry registry;
  std::atomic<int> registered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        // Every thread races for the same 50 names; exactly one wins each.
        if (registry.Register("p" + std::to_string(i), DummyFactory()).ok()) ++registered;
        auto p = registry.Create(t % 2 ? "lru" : "arc", 8);
        EXPECT_TRUE(p.ok());
        (void)registry.Names();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(registered.load(), 50);
  EXPECT_EQ(registry.Names().size(), 52u);
}

}  // namespace
}  // namespace kvo
