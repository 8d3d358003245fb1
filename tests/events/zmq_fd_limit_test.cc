// The subscriber under the open-file limit, in child processes whose limits the test sets (this
// binary makes no ZeroMQ socket in the parent, so each child starts ZeroMQ's global context
// afresh): a refused descriptor is an error naming the limit, and a context made under a raised
// limit takes more than ZeroMQ's default 1023 sockets (a 1 000-source indexer).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include <cerrno>
#include <cstdio>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/fd_limit.h"
#include "events/zmq_subscriber.h"
#include "tests/testing/child_process.h"

namespace kvo {
namespace {

using testing::InForkedChild;

SubscriberOptions To(int port) {
  SubscriberOptions o;
  o.endpoint = "tcp://127.0.0.1:" + std::to_string(port);  // nobody publishes: connects retry
  return o;
}

TEST(ZmqFdLimitTest, ASubscribeRefusedForWantOfDescriptorsNamesTheLimit) {
  EXPECT_EQ(InForkedChild([] {
              // UBSan's vptr check of a type it has not seen yet probes memory through a pipe,
              // which fails once descriptors are gone: let it see zmq::error_t and a subscriber
              // (made, failed and destroyed) first.
              try {
                throw zmq::error_t(EMFILE);
              } catch (const zmq::error_t& e) {
                if (e.num() != EMFILE || e.what() == nullptr) return 7;
              }
              if (!Subscriber::Create(To(19998), nullptr).ok()) return 8;  // made and destroyed
              std::vector<std::unique_ptr<Subscriber>> held;
              auto first = Subscriber::Create(To(19999), nullptr);
              if (!first.ok()) return 9;
              held.push_back(std::move(first).value());
              rlimit rl{40, 40};  // as `ulimit -n 40`
              if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
              for (int i = 0; i < 100; ++i) {  // each holds at least its mailbox's descriptor
                auto sub = Subscriber::Create(To(20000 + i), nullptr);
                if (sub.ok()) {
                  held.push_back(std::move(sub).value());
                  continue;
                }
                const std::string m = sub.status().ToString();
                std::fprintf(stderr, "refused after %zu: %s\n", held.size(), m.c_str());
                if (m.find("RLIMIT_NOFILE") == std::string::npos) return 2;
                if (m.find("is 40 (hard 40)") == std::string::npos) return 3;
                if (m.find("tcp://127.0.0.1:") == std::string::npos) return 4;
                return held.size() < 2 ? 5 : 0;
              }
              return 6;  // 100 subscribers under 40 descriptors: the limit was not reached
            }),
            0);
}

TEST(ZmqFdLimitTest, MoreThanZeroMqsDefaultSocketLimitUnderARaisedLimit) {
  auto lim = CurrentFdLimit();
  ASSERT_TRUE(lim.ok());
  if (lim->hard < 4096) GTEST_SKIP() << "hard open-file limit " << lim->hard << " < 4096";
  EXPECT_EQ(InForkedChild([] {
              if (!RaiseFdLimit().ok()) return 1;
              std::vector<std::unique_ptr<Subscriber>> held;
              for (int i = 0; i < 1100; ++i) {  // ZeroMQ's default limit is 1023 sockets
                auto sub = Subscriber::Create(To(20000 + i), nullptr);
                if (!sub.ok()) {
                  std::fprintf(stderr, "subscriber %d: %s\n", i, sub.status().ToString().c_str());
                  return 2;
                }
                held.push_back(std::move(sub).value());
              }
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace kvo
