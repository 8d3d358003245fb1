// cpp-httplib adapter (engine_client.h): httplib's types and exceptions stop in this file.
#include "route/engine_client.h"

#include <httplib.h>

#include <chrono>
#include <vector>

#include "common/mutex.h"

namespace kvo::route {

struct ClientPool::Impl {
  HttpAddress address;
  int timeout_ms = 0;
  size_t max_idle = 0;
  Mutex mu;
  std::vector<std::unique_ptr<httplib::Client>> idle GUARDED_BY(mu);

  // An idle connection (`*reused` = true) or a new one.
  std::unique_ptr<httplib::Client> Take(bool* reused) {
    {
      MutexLock lock(&mu);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        *reused = true;
        return c;
      }
    }
    *reused = false;
    return New();
  }
  std::unique_ptr<httplib::Client> New() {
    auto c = std::make_unique<httplib::Client>(address.host, address.port);
    auto t = std::chrono::milliseconds(timeout_ms);
    c->set_connection_timeout(t);
    c->set_read_timeout(t);
    c->set_write_timeout(t);
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    return c;
  }
  void Give(std::unique_ptr<httplib::Client> c) {
    MutexLock lock(&mu);
    if (idle.size() < max_idle) idle.push_back(std::move(c));
  }
  std::string Where(const std::string& method, const std::string& path) const {
    return "HTTP " + method + " http://" + address.host + ":" + std::to_string(address.port) + path;
  }
};

ClientPool::ClientPool(HttpAddress address, int timeout_ms, size_t max_idle)
    : address_(address), impl_(std::make_unique<Impl>()) {
  impl_->address = std::move(address);
  impl_->timeout_ms = timeout_ms;
  impl_->max_idle = max_idle;
}

ClientPool::~ClientPool() = default;

Result<HttpClientResult> ClientPool::Call(const std::string& method, const std::string& path,
                                          const std::string& body) {
  if (method != "GET" && method != "POST") {
    return Status::InvalidArgument("ClientPool: unsupported method '" + method + "'");
  }
  try {
    bool reused = false;
    auto client = impl_->Take(&reused);
    httplib::Result res =
        method == "GET" ? client->Get(path) : client->Post(path, body, "application/json");
    if (!res && reused) {
      // A kept-alive connection the server closed as we sent: once more on a new connection.
      client = impl_->New();
      res = method == "GET" ? client->Get(path) : client->Post(path, body, "application/json");
    }
    if (!res) {
      return Status::Unavailable(impl_->Where(method, path) + ": " +
                                 httplib::to_string(res.error()));
    }
    HttpClientResult out{res->status, std::move(res->body)};
    impl_->Give(std::move(client));
    return out;
  } catch (const std::exception& e) {
    return Status::Unavailable(impl_->Where(method, path) + ": " + e.what());
  }
}

Result<int> ClientPool::Stream(const std::string& path, const std::string& body,
                               const OnHead& on_head, const OnChunk& on_chunk) {
  try {
    bool reused = false;
    auto client = impl_->Take(&reused);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.headers.emplace("Content-Type", "application/json");
    bool cancelled = false;
    int status = 0;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      if (on_head(r.status, r.get_header_value("Content-Type"))) return true;
      cancelled = true;
      return false;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (on_chunk(std::string_view(data, n))) return true;
      cancelled = true;
      return false;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    bool ok = client->send(req, res, error);
    if (cancelled) return Status::Cancelled(impl_->Where("POST", path) + ": cancelled");
    if (!ok) {
      return Status::Unavailable(impl_->Where("POST", path) + ": " + httplib::to_string(error));
    }
    if (status == 0) {  // an answer without a body (204): the handler was not called
      status = res.status;
      if (!on_head(status, res.get_header_value("Content-Type"))) {
        return Status::Cancelled(impl_->Where("POST", path) + ": cancelled");
      }
    }
    impl_->Give(std::move(client));
    return status;
  } catch (const std::exception& e) {
    return Status::Unavailable(impl_->Where("POST", path) + ": " + e.what());
  }
}

}  // namespace kvo::route
