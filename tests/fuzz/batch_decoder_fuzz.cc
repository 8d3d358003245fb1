// libFuzzer target: kvo::DecodeBatch on arbitrary bytes must never crash, hang or throw; an error
// must say what was wrong. When decoding succeeds, encoding the batch and decoding it again gives
// an equal batch (map encoding) and re-encoding is stable (map and legacy array encodings).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/hex.h"
#include "events/codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::string Hex(std::string_view s) { return kvo::ToHex(s.substr(0, 512)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kvo::Result<kvo::EventBatch> first = kvo::DecodeBatch(input);
  if (!first.ok()) {
    FUZZ_CHECK(!first.status().message().empty(), "an error without a message");
    return 0;
  }
  const kvo::EventBatch& batch = *first;
  // A NaN anywhere (ts, extra_keys floats) makes the batch unequal to itself; the byte-level
  // checks below still hold for it.
  const bool comparable = batch == batch;

  for (kvo::EventEncoding encoding : {kvo::EventEncoding::kMap, kvo::EventEncoding::kArray}) {
    kvo::EncodeOptions options;
    options.encoding = encoding;
    const char* name = encoding == kvo::EventEncoding::kMap ? "map" : "array";
    std::string encoded = kvo::EncodeBatch(batch, options);
    kvo::Result<kvo::EventBatch> second = kvo::DecodeBatch(encoded);
    FUZZ_CHECK(second.ok(), "%s re-encoding does not decode: %s\ninput %s\nencoded %s", name,
               second.status().ToString().c_str(), Hex(input).c_str(), Hex(encoded).c_str());
    // The legacy array form has no slot for kvo's `reason` extension, so only the map form must
    // carry everything.
    if (encoding == kvo::EventEncoding::kMap && comparable) {
      FUZZ_CHECK(*second == batch, "map round trip changed the batch\ninput %s\nencoded %s",
                 Hex(input).c_str(), Hex(encoded).c_str());
    }
    std::string again = kvo::EncodeBatch(*second, options);
    FUZZ_CHECK(again == encoded, "%s encoding is not stable\nfirst  %s\nsecond %s", name,
               Hex(encoded).c_str(), Hex(again).c_str());
  }
  return 0;
}
