// CachePolicyRegistry: name -> factory, like vLLM's CachePolicyFactory (B.7). "lru" and "arc"
// are built in; Create runs the factory outside the lock.
#include "manager/cache_policy.h"

#include <cstdio>
#include <map>

#include "common/hex.h"
#include "common/mutex.h"
#include "manager/arc_policy.h"
#include "manager/lru_policy.h"

namespace kvo {

size_t MaxPolicyBlocks(std::string_view policy_name) {
  return policy_name == "arc" ? kMaxArcBlocks : kMaxLruBlocks;
}

bool CachePolicy::EvictInto(size_t n, std::span<const OffloadKey> protected_keys,
                            std::vector<std::pair<OffloadKey, BlockStatus>>* out) {
  out->clear();
  auto evicted = Evict(n, protected_keys);
  if (!evicted.has_value()) return false;
  *out = std::move(*evicted);
  return true;
}

namespace {

// Python's repr() of a str, for ASCII names: single quotes unless the name holds a single quote
// and no double quote.
std::string PyRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      AppendHex(std::string_view(reinterpret_cast<const char*>(&c), 1), &out);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

}  // namespace

struct CachePolicyRegistry::State {
  mutable Mutex mu;
  std::map<std::string, CachePolicyFactory> factories GUARDED_BY(mu);
};

CachePolicyRegistry::CachePolicyRegistry() : state_(std::make_unique<State>()) {
  MutexLock lock(&state_->mu);
  state_->factories["lru"] = [](size_t capacity) { return NewLruPolicy(capacity); };
  state_->factories["arc"] = [](size_t capacity) { return NewArcPolicy(capacity); };
}

CachePolicyRegistry::~CachePolicyRegistry() = default;

CachePolicyRegistry& CachePolicyRegistry::Global() {
  static CachePolicyRegistry* const registry = new CachePolicyRegistry();
  return *registry;
}

Status CachePolicyRegistry::Register(const std::string& name, CachePolicyFactory factory) {
  if (!factory) {
    return Status::InvalidArgument("cache policy " + PyRepr(name) + ": the factory is empty");
  }
  MutexLock lock(&state_->mu);
  if (state_->factories.contains(name)) {
    return Status::AlreadyExists("Cache policy " + PyRepr(name) + " is already registered.");
  }
  state_->factories.emplace(name, std::move(factory));
  return Status::Ok();
}

Result<std::unique_ptr<CachePolicy>> CachePolicyRegistry::Create(const std::string& name,
                                                                 size_t capacity) const {
  CachePolicyFactory factory;
  {
    MutexLock lock(&state_->mu);
    auto it = state_->factories.find(name);
    if (it != state_->factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string supported = "[";
    for (const std::string& n : Names()) {
      if (supported.size() > 1) supported += ", ";
      supported += PyRepr(n);
    }
    supported += "]";
    return Status::InvalidArgument("Unknown cache policy: " + PyRepr(name) +
                                   ". Supported: " + supported +
                                   ". For an out-of-tree policy, register it with "
                                   "CachePolicyRegistry.");
  }
  std::unique_ptr<CachePolicy> policy = factory(capacity);
  if (policy == nullptr) {
    return Status::Internal("cache policy " + PyRepr(name) + ": the factory returned null");
  }
  return policy;
}

std::vector<std::string> CachePolicyRegistry::Names() const {
  MutexLock lock(&state_->mu);
  std::vector<std::string> names;
  names.reserve(state_->factories.size());
  for (const auto& [n, f] : state_->factories) names.push_back(n);
  return names;
}

}  // namespace kvo
