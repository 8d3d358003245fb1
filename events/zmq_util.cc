#include "events/zmq_util.h"

#include <algorithm>
#include <cerrno>

#include "common/fd_limit.h"

namespace kvo::zmq_util {

zmq::context_t& GlobalContext() {
  // Leaked on purpose: sockets owned by static objects may outlive main().
  static auto* context = [] {
    auto* c = new zmq::context_t(1);
    // ZeroMQ refuses a socket past its own limit (1023 by default) with EMFILE, whatever the
    // process's open-file limit: 1 000 registered sources need more. Each socket holds at least
    // one descriptor (its mailbox), so the open-file limit in force when the context is made
    // (`kvo index serve` raises it first) bounds what can be used; capped so that ZeroMQ's slot
    // table stays small.
    auto lim = CurrentFdLimit();
    const uint64_t want = lim.ok() ? std::min<uint64_t>(lim->soft, 65536) : 1023;
    const int cap = c->get(zmq::ctxopt::socket_limit);
    const int n = std::clamp(static_cast<int>(want), 1023, std::max(cap, 1023));
    c->set(zmq::ctxopt::max_sockets, n);
    return c;
  }();
  return *context;
}

int MaxSockets() { return GlobalContext().get(zmq::ctxopt::max_sockets); }

Status ZmqError(std::string_view what, const zmq::error_t& e) {
  std::string m = std::string(what) + ": " + e.what();
  if (e.num() == EMFILE || e.num() == ENFILE) {
    m += " (" + FdLimitNote() + "; ZeroMQ's socket limit is " + std::to_string(MaxSockets()) + ")";
  }
  return Status::IOError(std::move(m));
}

}  // namespace kvo::zmq_util
