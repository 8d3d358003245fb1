// libFuzzer target: the Mooncake/Dynamo router API's query bodies (POST /query and
// /query_by_hash), kvo::ParseRouterQuery, whose hand-written list scanner reads the one big list
// (token_ids / seq_hashes / block_hash) and leaves the rest to the JSON DOM. Checks: never a crash
// or throw; an error is InvalidArgument with a bounded message; the scanner agrees with the
// reference parser (the whole body through the DOM, ParseRouterQueryReference): both accept with
// equal fields, or both refuse. The first input byte picks the route (bit 0) and the item limit
// (bits 1-3: 1, 2, 4, ... 128 items); the rest is the body. /query bodies are also read as an
// arriving body whose list goes in 16-byte chunks to a ListHelper's thread (chunk boundaries in
// and around every element): the same answer as the whole-body scanner.
#include <cstdint>
#include <string>
#include <string_view>

#include "http/http_server.h"
#include "indexer/service/router_api.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// A body that has arrived whole.
class WholeBody final : public kvo::ArrivingBody {
 public:
  explicit WholeBody(std::string_view b) : b_(b) {}
  const char* data() const override { return b_.data(); }
  size_t size() const override { return b_.size(); }
  size_t WaitBeyond(size_t) const override { return b_.size(); }

 private:
  std::string_view b_;
};

kvo::ListHelper& Lists() {
  static auto* lists = [] {
    kvo::ListHelper::Options o;
    o.chunk_bytes = 16;
    o.max_chunks = 1u << 16;
    o.min_list_bytes = 0;
    return new kvo::ListHelper(o);  // leaked: its thread outlives the fuzzer's last input
  }();
  return *lists;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool by_hash = (data[0] & 1) != 0;
  const int64_t max_items = int64_t{1} << ((data[0] >> 1) & 7);
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  kvo::Result<kvo::RouterQuery> fast = kvo::ParseRouterQuery(body, by_hash, max_items);
  kvo::Result<kvo::RouterQuery> ref = kvo::ParseRouterQueryReference(body, by_hash, max_items);
  if (!by_hash && !body.empty()) {
    const WholeBody arrived(body);
    const auto lease = Lists().TryLease();
    kvo::Result<kvo::RouterQuery> chunked =
        kvo::ParseRouterQuery(arrived, max_items, nullptr, lease.get());
    FUZZ_CHECK(chunked.ok() == fast.ok(), "chunked %s, scanner %s on %s",
               chunked.status().ToString().c_str(), fast.status().ToString().c_str(),
               kvo_fuzz::Preview(body).c_str());
    FUZZ_CHECK(!chunked.ok() || chunked->token_ids == fast->token_ids,
               "chunked token_ids differ (%zu / %zu items) on %s", chunked->token_ids.size(),
               fast->token_ids.size(), kvo_fuzz::Preview(body).c_str());
  }
  FUZZ_CHECK(fast.ok() == ref.ok(), "scanner %s, reference %s on %s",
             fast.status().ToString().c_str(), ref.status().ToString().c_str(),
             kvo_fuzz::Preview(body).c_str());
  if (!fast.ok()) {
    for (const kvo::Status* st : {&fast.status(), &ref.status()}) {
      FUZZ_CHECK(st->code() == kvo::StatusCode::kInvalidArgument, "%s", st->ToString().c_str());
      FUZZ_CHECK_MESSAGE(st->message());
    }
    return 0;
  }
  const kvo::RouterQuery& a = *fast;
  const kvo::RouterQuery& b = *ref;
  FUZZ_CHECK(a.model == b.model && a.lora_name == b.lora_name && a.tenant_id == b.tenant_id &&
                 a.instance_id == b.instance_id && a.block_size == b.block_size &&
                 a.cache_salt == b.cache_salt,
             "scalar fields differ on %s", kvo_fuzz::Preview(body).c_str());
  FUZZ_CHECK(a.token_ids == b.token_ids, "token_ids differ (%zu / %zu items) on %s",
             a.token_ids.size(), b.token_ids.size(), kvo_fuzz::Preview(body).c_str());
  FUZZ_CHECK(a.hashes == b.hashes, "hashes differ (%zu / %zu items) on %s", a.hashes.size(),
             b.hashes.size(), kvo_fuzz::Preview(body).c_str());
  FUZZ_CHECK(static_cast<int64_t>(a.token_ids.size() + a.hashes.size()) <= max_items,
             "%zu items over the limit %lld", a.token_ids.size() + a.hashes.size(),
             static_cast<long long>(max_items));
  FUZZ_CHECK(by_hash ? a.token_ids.empty() : a.hashes.empty(), "the other route's list is set");
  return 0;
}
