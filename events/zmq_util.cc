#include "events/zmq_util.h"

namespace kvo::zmq_util {

zmq::context_t& GlobalContext() {
  // Leaked on purpose: sockets owned by static objects may outlive main().
  static auto* context = new zmq::context_t(1);
  return *context;
}

}  // namespace kvo::zmq_util
