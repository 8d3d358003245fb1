// libFuzzer target: the frames of a replay reply (zmq_util::ParseReplayReply, what the
// subscriber's DEALER receives) and of a live PUB message (ParseLiveSeq), then the batch payload
// they carry (DecodeBatch with the subscriber's limits), from arbitrary bytes. Never a crash; the
// parsed fields agree with the frames (an independent reading of the documented layout); the
// payload decodes or fails with a bounded message.
//
// Input: frames as [len u8][bytes]..., the last frame takes whatever is left when shorter.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/codec.h"
#include "events/zmq_subscriber.h"
#include "events/zmq_util.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

uint64_t BigEndian(std::string_view b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = v * 256 + c;
  return v;
}

bool Inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

void CheckPayload(std::string_view payload) {
  kvo::SubscriberOptions options;
  kvo::Result<kvo::EventBatch> batch = kvo::DecodeBatch(payload, options.limits);
  if (!batch.ok()) FUZZ_CHECK_MESSAGE(batch.status().message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> frames;
  while (!in.empty() && frames.size() < 8) {
    size_t len = static_cast<unsigned char>(in[0]);
    in.remove_prefix(1);
    if (len > in.size()) len = in.size();
    frames.push_back(in.substr(0, len));
    in.remove_prefix(len);
  }
  if (!in.empty()) frames.push_back(in);  // a large last frame (a payload)

  const kvo::zmq_util::ReplayReply r = kvo::zmq_util::ParseReplayReply(frames);
  const size_t n = frames.size();
  const bool shape_ok = (n == 3 || n == 4) && frames[0].empty();
  using Kind = kvo::zmq_util::ReplayReply::Kind;
  if (!shape_ok) {
    FUZZ_CHECK(r.kind == Kind::kMalformed, "a %zu-frame reply accepted", n);
  } else {
    const bool topic = n == 4;
    std::string_view seq = frames[topic ? 2 : 1];
    std::string_view payload = frames[topic ? 3 : 2];
    FUZZ_CHECK(r.with_topic == topic, "with_topic");
    if (seq == kvo::zmq_util::kEndSeq && payload.empty()) {
      FUZZ_CHECK(r.kind == Kind::kEnd, "the end marker not seen");
    } else if (seq.size() != 8) {
      FUZZ_CHECK(r.kind == Kind::kMalformed, "a %zu-byte seq accepted", seq.size());
    } else if (seq == kvo::zmq_util::kEndSeq) {
      // The end marker's seq with a payload: 2^64-1 is never a real sequence number.
      FUZZ_CHECK(r.kind == Kind::kMalformed, "the end-marker seq accepted as a batch");
    } else {
      FUZZ_CHECK(r.kind == Kind::kBatch, "a batch not seen");
      FUZZ_CHECK(r.seq == BigEndian(seq), "seq");
      FUZZ_CHECK(r.payload == payload && Inside(r.payload, payload), "payload");
      FUZZ_CHECK(r.topic == (topic ? frames[1] : std::string_view()), "topic");
      CheckPayload(r.payload);
    }
  }

  std::optional<uint64_t> live = kvo::zmq_util::ParseLiveSeq(frames);
  if (n == 3 && frames[1].size() == 8) {
    FUZZ_CHECK(live && *live == BigEndian(frames[1]), "live seq");
    CheckPayload(frames[2]);
  } else {
    FUZZ_CHECK(!live, "a malformed live message accepted");
  }
  return 0;
}
