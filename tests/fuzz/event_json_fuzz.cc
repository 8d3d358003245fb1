// libFuzzer target: the JSON form of event batches (kvo::BatchFromJson, used by `kvo events
// publish` and journal tools) and --extra-keys text (ExtraKeysFromJsonText) on arbitrary text:
// never a crash or throw; errors are bounded messages. A parsed batch round-trips through its
// JSON form (BatchFromJson(BatchToJson(b)) == b, and BatchToJson is stable), renders as text, and
// means the same on the wire: msgpack-encoding it and decoding gives the same batch.
#include <cstdint>
#include <string>
#include <string_view>

#include "events/codec.h"
#include "events/event_json.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);

  kvo::Result<std::vector<kvo::Value>> extra = kvo::ExtraKeysFromJsonText(input, "--extra-keys");
  if (!extra.ok()) FUZZ_CHECK_MESSAGE(extra.status().message());

  kvo::Result<kvo::EventBatch> batch = kvo::BatchFromJson(input);
  if (!batch.ok()) {
    FUZZ_CHECK(batch.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               batch.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(batch.status().message());
    return 0;
  }
  const bool comparable = *batch == *batch;  // a NaN (ts, float extra keys) is unequal to itself
  const std::string json = kvo::BatchToJson(*batch, 7, "kv@fuzz");
  kvo::Result<kvo::EventBatch> again = kvo::BatchFromJson(json);
  FUZZ_CHECK(again.ok(), "BatchToJson output does not parse: %s\n%s",
             again.status().ToString().c_str(), kvo_fuzz::Preview(json, 2000).c_str());
  if (comparable) {
    FUZZ_CHECK(*again == *batch, "JSON round trip changed the batch\ninput %s\njson %s",
               kvo_fuzz::Preview(input, 2000).c_str(), kvo_fuzz::Preview(json, 2000).c_str());
  }
  FUZZ_CHECK(kvo::BatchToJson(*again, 7, "kv@fuzz") == json, "BatchToJson is not stable\n%s",
             kvo_fuzz::Preview(json, 2000).c_str());
  (void)kvo::BatchToText(*batch, 7);

  const std::string wire = kvo::EncodeBatch(*batch);
  kvo::Result<kvo::EventBatch> decoded = kvo::DecodeBatch(wire);
  FUZZ_CHECK(decoded.ok(), "a JSON batch does not decode from its msgpack form: %s\n%s",
             decoded.status().ToString().c_str(), kvo_fuzz::Preview(input, 2000).c_str());
  if (comparable) {
    FUZZ_CHECK(*decoded == *batch, "the msgpack form means another batch\n%s",
               kvo_fuzz::Preview(input, 2000).c_str());
  }
  return 0;
}
