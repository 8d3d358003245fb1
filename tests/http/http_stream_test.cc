// Streaming responses (chunked, text/event-stream) and the streaming client (issue 13): chunks
// reach the client while the producer is still running, a client that goes away or a server that
// stops ends the producer's writes, and plain clients still read the whole body.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "http/http_server.h"

namespace kvo {
namespace {

class HttpStreamTest : public ::testing::Test {
 protected:
  void StartServer(HttpServer::Handler handler) {
    HttpServerOptions o;
    o.address = {"127.0.0.1", 0};
    o.write_timeout_ms = 3000;
    auto s = HttpServer::Start(o, std::move(handler));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    address_ = {"127.0.0.1", server_->port()};
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  std::unique_ptr<HttpServer> server_;
  HttpAddress address_;
};

// The producer writes its second chunk only after the client has received the first: a server
// that buffered the stream would leave the client waiting and the producer would time out.
TEST_F(HttpStreamTest, ChunksArriveWhileTheProducerRuns) {
  std::mutex mu;
  std::condition_variable cv;
  bool first_seen = false;
  StartServer([&](const HttpRequest&) {
    return HttpResponse::Stream([&](const ChunkWriter& write) {
      write("data: one\n\n");
      bool seen;
      {
        std::unique_lock<std::mutex> lock(mu);
        seen = cv.wait_for(lock, std::chrono::seconds(10), [&] { return first_seen; });
      }
      write(seen ? "data: two\n\n" : "data: TIMEOUT\n\n");
      write("");  // nothing
      write("data: [DONE]\n\n");
    });
  });
  std::string got;
  int chunks = 0;
  auto r = HttpStreamCall(address_, "POST", "/v1/completions", "{}", 5000, [&](std::string_view c) {
    got += c;
    ++chunks;
    if (got.find("one") != std::string::npos) {
      std::lock_guard<std::mutex> lock(mu);
      first_seen = true;
      cv.notify_all();
    }
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(got, "data: one\n\ndata: two\n\ndata: [DONE]\n\n");
  EXPECT_GE(chunks, 2);
  // A plain client reads the whole chunked body; the connection is usable again afterwards.
  {
    std::lock_guard<std::mutex> lock(mu);
    first_seen = true;
  }
  auto plain = HttpCall(address_, "GET", "/x", "", 5000);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->body, "data: one\n\ndata: two\n\ndata: [DONE]\n\n");
}

TEST_F(HttpStreamTest, StatusAndContentTypeOfAStreamAreSent) {
  StartServer([](const HttpRequest&) {
    HttpResponse r =
        HttpResponse::Stream([](const ChunkWriter& w) { w("{\"x\":1}"); }, "application/json");
    r.status = 202;
    return r;
  });
  std::string got;
  auto r = HttpStreamCall(address_, "GET", "/", "", 5000, [&](std::string_view c) {
    got += c;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 202);
  EXPECT_EQ(got, "{\"x\":1}");
}

// A client that stops reading after the first chunk: the producer's writes fail (bounded loop).
TEST_F(HttpStreamTest, ClientGoneEndsTheProducer) {
  std::promise<int> writes_until_false;
  StartServer([&](const HttpRequest&) {
    return HttpResponse::Stream([&](const ChunkWriter& write) {
      const std::string chunk(4096, 'x');
      for (int i = 0; i < 200000; ++i) {
        if (!write(chunk)) {
          writes_until_false.set_value(i);
          return;
        }
      }
      writes_until_false.set_value(-1);
    });
  });
  auto fut = writes_until_false.get_future();
  auto r = HttpStreamCall(address_, "GET", "/", "", 5000, [](std::string_view) { return false; });
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_GE(fut.get(), 1) << "a write after the client left should fail, not succeed forever";
}

// Stop() with a producer writing in a loop: its writes return false and Stop() returns.
TEST_F(HttpStreamTest, StopEndsARunningStream) {
  std::atomic<bool> producer_ended{false};
  std::promise<void> started;
  StartServer([&](const HttpRequest&) {
    return HttpResponse::Stream([&](const ChunkWriter& write) {
      started.set_value();
      for (int i = 0; i < 1000000 && write("data: x\n\n"); ++i) {
      }
      producer_ended = true;
    });
  });
  std::thread client([&] {
    (void)HttpStreamCall(address_, "GET", "/", "", 5000, [](std::string_view) { return true; });
  });
  ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_TRUE(producer_ended.load());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  client.join();
}

TEST(HttpUrlTest, ParsesHostAndPort) {
  auto a = ParseHttpUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  auto b = ParseHttpUrl("localhost:9/v1/x");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "localhost");
  EXPECT_EQ(b->port, 9);
  auto v6 = ParseHttpUrl("http://[::1]:80/");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  for (const char* bad : {"http://127.0.0.1", "https://h:1", "http://:80", "http://h:0",
                          "http://h:70000", "h:1x", ""}) {
    auto r = ParseHttpUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace kvo
