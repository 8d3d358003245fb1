// Where an HTTP server listens or a client connects: a host and a port (0: any free port).
#pragma once

#include <string>

namespace kvo {

struct HttpAddress {
  std::string host;
  int port = 0;
};

}  // namespace kvo
