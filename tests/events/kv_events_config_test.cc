#include "events/kv_events_config.h"

#include <gtest/gtest.h>
#include <limits>

#include "events/zmq_publisher.h"

namespace kvo {
namespace {

TEST(KvEventsConfigTest, DefaultsMatchVllm) {
  auto c = ParseKvEventsConfig("{}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->enable_kv_cache_events);
  EXPECT_EQ(c->publisher, "null");
  EXPECT_EQ(c->endpoint, "tcp://*:5557");
  EXPECT_FALSE(c->replay_endpoint.has_value());
  EXPECT_EQ(c->buffer_steps, 10000);
  EXPECT_EQ(c->hwm, 100000);
  EXPECT_EQ(c->max_queue_size, 100000);
  EXPECT_EQ(c->topic, "");
}

TEST(KvEventsConfigTest, PublisherResolvesFromTheSwitch) {
  EXPECT_EQ(ParseKvEventsConfig(R"({"enable_kv_cache_events":true})")->publisher, "zmq");
  EXPECT_EQ(ParseKvEventsConfig(R"({"enable_kv_cache_events":true,"publisher":null})")->publisher,
            "zmq");
  EXPECT_EQ(ParseKvEventsConfig(R"({"enable_kv_cache_events":true,"publisher":"null"})")->publisher,
            "null");
  auto full = ParseKvEventsConfig(
      R"({"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:6000",
          "replay_endpoint":"tcp://127.0.0.1:6001","buffer_steps":5,"hwm":7,"max_queue_size":9,
          "topic":"kv-events","journal_dir":"/tmp/j","journal_fsync":"batch","encoding":"array"})");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->replay_endpoint, "tcp://127.0.0.1:6001");
  EXPECT_EQ(full->buffer_steps, 5);
  EXPECT_EQ(full->topic, "kv-events");
  EXPECT_EQ(full->journal_dir, "/tmp/j");
  EXPECT_EQ(full->encoding, "array");
}

void ExpectRejected(const std::string& json, const std::string& fragment) {
  auto c = ParseKvEventsConfig(json);
  ASSERT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().ToString();
}

TEST(KvEventsConfigTest, RejectsBadInputNamingKeyAndValue) {
  ExpectRejected(R"({"publisher":"kafka"})", "Input should be 'null' or 'zmq', got \"kafka\"");
  ExpectRejected(R"({"hwm":"100"})", "'hwm' must be an integer, got \"100\"");
  ExpectRejected(R"({"buffer_steps":true})", "'buffer_steps' must be an integer, got true");
  ExpectRejected(R"({"buffer_steps":-1})", "'buffer_steps' must be a non-negative integer");
  ExpectRejected(R"({"enable_kv_cache_events":1})", "'enable_kv_cache_events' must be true or");
  ExpectRejected(R"({"endpont":"tcp://*:1"})", "unknown key 'endpont'");
  ExpectRejected(R"({"journal_fsync":"sometimes"})", "journal_fsync");
  ExpectRejected(R"({"encoding":"cbor"})", "'encoding' must be");
  ExpectRejected(R"([1,2])", "expected a JSON object");
  ExpectRejected(R"({"topic":)", "invalid JSON");
}

TEST(KvEventsConfigTest, OffsetsPortsLikeVllm) {
  EXPECT_EQ(*OffsetEndpointPort("tcp://*:5557", 0), "tcp://*:5557");
  EXPECT_EQ(*OffsetEndpointPort("tcp://*:5557", 1), "tcp://*:5558");
  EXPECT_EQ(*OffsetEndpointPort("tcp://[::1]:5557", 3), "tcp://[::1]:5560");
  EXPECT_EQ(*OffsetEndpointPort("inproc://events", 2), "inproc://events_dp2");
  EXPECT_EQ(*OffsetEndpointPort("ipc:///tmp/x", 0), "ipc:///tmp/x");
  EXPECT_EQ(*OffsetEndpointPort("", 4), "");
  auto bad = OffsetEndpointPort("ipc:///tmp/x", 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Invalid endpoint: must contain 'inproc' or 'tcp'"),
            std::string::npos);
  EXPECT_FALSE(OffsetEndpointPort("tcp://host:port", 1).ok());
}

// Issue 10 item 12: an impossible port or a NUL byte in an endpoint was accepted.
TEST(KvEventsConfigTest, RejectsImpossibleEndpointsNamingThem) {
  const std::string on = R"("enable_kv_cache_events":true,)";
  ExpectRejected("{" + on + R"("endpoint":"tcp://127.0.0.1:99999"})",
                 "'endpoint' 'tcp://127.0.0.1:99999': the port must be a number in 1-65535");
  ExpectRejected("{" + on + R"("endpoint":"tcp://127.0.0.1:5557\u0000x"})",
                 "'endpoint' 'tcp://127.0.0.1:5557\\x00x': contains a control character");
  ExpectRejected(R"({"replay_endpoint":"tcp://127.0.0.1:0"})", "'replay_endpoint'");
  ExpectRejected(R"({"replay_endpoint":"udp://x:1"})", "must be tcp://HOST:PORT");
  ExpectRejected("{" + on + R"("endpoint":"tcp://:5557"})", "must be tcp://HOST:PORT");
  ExpectRejected("{" + on + R"("endpoint":")" + std::string(5000, 'a') + R"("})",
                 "...(5000 bytes)");
  EXPECT_TRUE(ValidateEndpoint("tcp://*:5557", "x").ok());
  EXPECT_TRUE(ValidateEndpoint("tcp://[::1]:65535", "x").ok());
  EXPECT_TRUE(ValidateEndpoint("tcp://127.0.0.1:*", "x").ok());
  EXPECT_TRUE(ValidateEndpoint("ipc:///tmp/kv.sock", "x").ok());
  EXPECT_TRUE(ValidateEndpoint("inproc://events", "x").ok());
  Status nul = ValidateEndpoint(std::string("tcp://h:1\0", 10), "--endpoint");
  ASSERT_FALSE(nul.ok());
  EXPECT_NE(nul.message().find("--endpoint"), std::string::npos);
  EXPECT_FALSE(OffsetEndpointPort("tcp://*:65535", 1).ok());
}

// Found by tests/fuzz/kv_events_config_fuzz: a port near INT64_MAX plus a DP rank overflowed
// (signed overflow, undefined behaviour; UBSan aborted). It is an error naming the endpoint.
TEST(KvEventsConfigTest, OffsetPortOverflowIsAnError) {
  auto r = OffsetEndpointPort("tcp://h:9223372036854775807", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("exceeds 65535"), std::string::npos) << r.status().message();
  EXPECT_FALSE(OffsetEndpointPort("tcp://h:65535", std::numeric_limits<int64_t>::min()).ok());
  EXPECT_FALSE(OffsetEndpointPort("tcp://h:1", std::numeric_limits<int64_t>::max()).ok());
  EXPECT_EQ(*OffsetEndpointPort("tcp://h:65534", 1), "tcp://h:65535");
  EXPECT_FALSE(OffsetEndpointPort("tcp://h:-9223372036854775808", -1).ok());
}

TEST(KvEventsConfigTest, BindOrConnectRule) {
  EXPECT_TRUE(ShouldBind("tcp://*:5557"));
  EXPECT_TRUE(ShouldBind("tcp://[::]:5557"));
  EXPECT_TRUE(ShouldBind("ipc:///tmp/kv"));
  EXPECT_TRUE(ShouldBind("inproc://kv"));
  EXPECT_FALSE(ShouldBind("tcp://127.0.0.1:5557"));
  EXPECT_FALSE(ShouldBind("tcp://router.example:5557"));
  EXPECT_TRUE(BindsBeyondLoopback("tcp://*:5557"));
  EXPECT_TRUE(BindsBeyondLoopback("tcp://0.0.0.0:5557"));
  EXPECT_FALSE(BindsBeyondLoopback("tcp://127.0.0.1:5557"));
  EXPECT_FALSE(BindsBeyondLoopback("ipc:///tmp/kv"));
}

TEST(EventPublisherFactoryTest, NullWhenDisabledZmqWithOffsetEndpointsWhenEnabled) {
  KvEventsConfig disabled;
  auto null_pub = CreateEventPublisher(disabled, 0);
  ASSERT_TRUE(null_pub.ok());
  EXPECT_FALSE((*null_pub)->publisher_config().has_value());
  EXPECT_TRUE((*null_pub)->Publish(EventBatch{}).ok());

  KvEventsConfig c = *ParseKvEventsConfig(
      R"({"enable_kv_cache_events":true,"endpoint":"inproc://factory",
          "replay_endpoint":"inproc://factory-replay"})");
  auto pub = CreateEventPublisher(c, 1);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  auto resolved = (*pub)->publisher_config();
  ASSERT_TRUE(resolved.has_value());
  EXPECT_EQ(resolved->endpoint, "inproc://factory_dp1");
  EXPECT_EQ(resolved->replay_endpoint, "inproc://factory-replay_dp1");
  EXPECT_EQ(c.endpoint, "inproc://factory");  // the input config is unchanged
  (*pub)->Shutdown();
  EXPECT_EQ((*pub)->Publish(EventBatch{}).code(), StatusCode::kFailedPrecondition);

  c.endpoint = "ipc:///tmp/kvo-factory";
  auto bad = CreateEventPublisher(c, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Invalid endpoint"), std::string::npos);
}

// Issue 10 item 1: the error message dump()ed a 10^5-deep value and overflowed the stack.
TEST(KvEventsConfigTest, RefusesDeepNestingInABoundedMessage) {
  auto c = ParseKvEventsConfig("{\"topic\": " + std::string(100000, '[') +
                               std::string(100000, ']') + "}");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--kv-events-config: JSON nested deeper than 64"),
            std::string::npos)
      << c.status().message();
  EXPECT_LT(c.status().message().size(), 200u);
}

}  // namespace
}  // namespace kvo
