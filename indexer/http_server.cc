// cpp-httplib adapter: its types and exceptions stop in this file.
#include "indexer/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/logging.h"

namespace kvo {

struct HttpServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> done{false};
  int port = 0;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                      Handler handler) {
  auto impl = std::make_unique<Impl>();
  httplib::Server& s = impl->server;
  const int workers = options.worker_threads > 0 ? options.worker_threads : 1;
  s.new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  s.set_payload_max_length(options.max_body_bytes);
  s.set_read_timeout(options.read_timeout_s, 0);
  s.set_keep_alive_max_count(1000);
  auto serve = [handler](const httplib::Request& req, httplib::Response& res) {
    HttpRequest r{req.method, req.path, req.body};
    HttpResponse out;
    try {
      out = handler(r);
    } catch (const std::exception& e) {
      out = HttpResponse{500, "application/json", std::string("{\"error\":\"internal error\"}")};
      KVO_LOG_ERROR("http {} {}: {}", req.method, req.path, e.what());
    }
    res.status = out.status;
    res.set_content(out.body, out.content_type.c_str());
  };
  // Every path goes to the handler, which answers 404/405 itself.
  s.Get(".*", serve);
  s.Post(".*", serve);
  s.Put(".*", serve);
  s.Delete(".*", serve);
  s.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        KVO_LOG_ERROR("http {} {}: {}", req.method, req.path, what);
        res.status = 500;
        res.set_content("{\"error\":\"internal error\"}", "application/json");
      });
  int port = 0;
  try {
    if (options.address.port == 0) {
      port = s.bind_to_any_port(options.address.host);
      if (port < 0) port = 0;
    } else if (s.bind_to_port(options.address.host, options.address.port)) {
      port = options.address.port;
    }
  } catch (const std::exception& e) {
    return Status::Unavailable("HTTP server on " + options.address.host + ":" +
                               std::to_string(options.address.port) + ": " + e.what());
  }
  if (port <= 0) {
    return Status::Unavailable("HTTP server: cannot bind " + options.address.host + ":" +
                               std::to_string(options.address.port) +
                               " (address in use or not local?)");
  }
  impl->port = port;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    try {
      raw->server.listen_after_bind();
    } catch (const std::exception& e) {
      KVO_LOG_ERROR("http server stopped: {}", e.what());
    }
    raw->done = true;
  });
  // Server::stop() only acts once the loop runs: wait for it (or for its early exit).
  while (!raw->server.is_running() && !raw->done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  // listen_after_bind may not have entered its loop yet; stop() closes the socket either way.
  impl_->server.stop();
  impl_->thread.join();
}

Result<HttpClientResult> HttpCall(const HttpAddress& address, const std::string& method,
                                  const std::string& path, const std::string& body,
                                  int timeout_ms) {
  try {
    httplib::Client client(address.host, address.port);
    auto timeout = std::chrono::milliseconds(timeout_ms);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    if (method != "GET" && method != "POST") {
      return Status::InvalidArgument("HttpCall: unsupported method '" + method + "'");
    }
    httplib::Result res =
        method == "GET" ? client.Get(path) : client.Post(path, body, "application/json");
    if (!res) {
      return Status::Unavailable("HTTP " + method + " http://" + address.host + ":" +
                                 std::to_string(address.port) + path + ": " +
                                 httplib::to_string(res.error()));
    }
    return HttpClientResult{res->status, res->body};
  } catch (const std::exception& e) {
    return Status::Unavailable("HTTP " + method + " " + path + ": " + e.what());
  }
}

}  // namespace kvo
