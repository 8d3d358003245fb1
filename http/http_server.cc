// Boost.Beast server and cpp-httplib client adapter: their types and exceptions stop in this file.
#include "http/http_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <pthread.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <deque>
#include <future>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/spin.h"

namespace kvo {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// {"error": message} without a JSON library (the message is ours, ASCII, no control bytes).
std::string ErrorBody(const std::string& message) {
  std::string out = "{\"error\":\"";
  for (char c : message) {
    if (c == '"' || c == '\\') out += '\\';
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out + "\"}";
}

// A claim on the server's budget of body bytes in flight; released when destroyed.
class BodyBytes {
 public:
  BodyBytes() = default;
  explicit BodyBytes(std::atomic<size_t>* pool) : pool_(pool) {}
  BodyBytes(BodyBytes&& o) noexcept : pool_(o.pool_), bytes_(std::exchange(o.bytes_, 0)) {}
  BodyBytes& operator=(BodyBytes&&) = delete;
  ~BodyBytes() { Release(); }

  // False (and nothing claimed) when `n` more bytes would pass `limit`.
  bool Claim(size_t n, size_t limit) {
    size_t cur = pool_->load(std::memory_order_relaxed);
    do {
      if (n > limit || cur > limit - n) return false;
    } while (!pool_->compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    bytes_ += n;
    return true;
  }
  void Release() {
    if (bytes_ != 0) pool_->fetch_sub(std::exchange(bytes_, 0), std::memory_order_relaxed);
  }

 private:
  std::atomic<size_t>* pool_ = nullptr;
  size_t bytes_ = 0;
};

// A body the I/O thread reads while a worker follows it (HttpServerOptions::early_paths): one
// 32-bit word, (bytes in place << 2) | state, written only by the I/O thread, so the worker can
// spin on it or block on it (std::atomic::wait) and every change wakes it.
class Arrival {
 public:
  static constexpr size_t kMaxBytes = (size_t{1} << 30) - 1;  // what the word can count

  explicit Arrival(size_t have) : word_(static_cast<uint32_t>(have) << 2) {}

  // I/O thread: the first `have` bytes are in place (release: the worker may read them).
  void Progress(size_t have) { Set(have, kReading); }
  // I/O thread: all `size` bytes are in place, or (failed) the body never will be. The first end
  // wins.
  void Complete(size_t size) { Set(size, kComplete); }
  void Fail() { Set(word_.load(std::memory_order_relaxed) >> 2, kFailed); }

  // Worker: reads one byte of every cache line as it arrives (from `seen` on), so the handler
  // finds the body in this core's cache; spins briefly between pieces when `spin`, else blocks.
  // True once the body is complete, false when it failed.
  bool Follow(const char* data, size_t seen, bool spin) const {
    for (;;) {
      const uint32_t w = WaitBeyond(seen, spin);
      const size_t have = w >> 2;
      uint64_t sum = 0;
      for (size_t i = seen; i < have; i += 64) sum += static_cast<unsigned char>(data[i]);
      asm volatile("" : : "r"(sum));  // the loads are the point: keep them
      seen = std::max(seen, have);
      if ((w & 3) != kReading) return (w & 3) == kComplete;
    }
  }
  // Worker: waits for the end of the body; true when it is complete, false when it failed.
  bool Wait(bool spin) const {
    for (;;) {
      const uint32_t w = WaitBeyond(word_.load(std::memory_order_relaxed) >> 2, spin);
      if ((w & 3) != kReading) return (w & 3) == kComplete;
    }
  }
  // Worker: waits until more than `have` bytes are in place or the body ends (spinning for
  // kSpinFor first when `spin`); returns the word (acquire: those bytes may be read).
  uint32_t WaitBeyond(size_t have, bool spin) const {
    const auto since = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const uint32_t w = word_.load(std::memory_order_acquire);
      if ((w >> 2) > have || (w & 3) != kReading) return w;
      if (spin && (spins % 64 != 63 || std::chrono::steady_clock::now() - since < kSpinFor)) {
        CpuRelax();
        continue;
      }
      word_.wait(w, std::memory_order_acquire);
    }
  }

  static size_t Bytes(uint32_t word) { return word >> 2; }

 private:
  enum : uint32_t { kReading = 0, kComplete = 1, kFailed = 2 };
  static constexpr auto kSpinFor = std::chrono::microseconds(50);

  void Set(size_t have, uint32_t state) {
    if ((word_.load(std::memory_order_relaxed) & 3) != kReading) return;
    word_.store(static_cast<uint32_t>(have) << 2 | state, std::memory_order_release);
    word_.notify_all();  // the handler, and a thread it shares the body with (a list's chunks)
  }

  std::atomic<uint32_t> word_;
};

// What a handler on an arriving path reads (HttpRequest::arriving): body_ as the I/O thread
// fills it.
class BodyInPlace final : public ArrivingBody {
 public:
  BodyInPlace(const Arrival* arrival, const char* data, size_t size, bool spin)
      : arrival_(arrival), data_(data), size_(size), spin_(spin) {}
  const char* data() const override { return data_; }
  size_t size() const override { return size_; }
  size_t WaitBeyond(size_t have) const override {
    return Arrival::Bytes(arrival_->WaitBeyond(have, spin_));
  }

 private:
  const Arrival* const arrival_;
  const char* const data_;
  const size_t size_;
  const bool spin_;
};

// The handlers' workers. Unlike ThreadPool (which wakes whichever worker the condition variable
// picks: in practice they take turns), the worker that went idle last takes the next request, so
// a sequential client's requests keep running on one thread with warm caches (the index, the
// allocator's arena) instead of a cold one each time (on a 16-core host the router API's handler
// ran ~2x slower through HTTP than in a loop). Queued tasks still run before the destructor
// joins the workers.
class HandlerPool {
 public:
  HandlerPool(int num_threads, const std::string& name) {
    workers_.resize(static_cast<size_t>(std::max(1, num_threads)));
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i] = std::make_unique<Worker>(&mu_);
      workers_[i]->thread = std::thread([this, w = workers_[i].get()] { Loop(w); });
      const std::string thread_name = name.substr(0, 12) + "-" + std::to_string(i);
      pthread_setname_np(workers_[i]->thread.native_handle(), thread_name.c_str());
    }
  }
  ~HandlerPool() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& w : workers_) w->cv.Signal();
    }
    for (auto& w : workers_) w->thread.join();
  }
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void Schedule(std::function<void()> fn) {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (!idle_.empty()) {
      Worker* w = idle_.back();
      idle_.pop_back();
      w->idle = false;
      w->cv.Signal();
    }
  }

 private:
  struct Worker {
    explicit Worker(Mutex* mu) : cv(mu) {}
    std::thread thread;
    CondVar cv;
    bool idle = false;  // on idle_ (guarded by the pool's mutex)
  };

  void Loop(Worker* w) {
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stopping_) {
          if (!w->idle) {
            w->idle = true;
            idle_.push_back(w);
          }
          w->cv.Wait();
        }
        if (queue_.empty()) return;  // stopping and drained
        if (w->idle) {               // woken by the destructor while listed
          idle_.erase(std::find(idle_.begin(), idle_.end(), w));
          w->idle = false;
        }
        fn = std::move(queue_.front());
        queue_.pop_front();
        // More work than this worker: wake another idle one.
        if (!queue_.empty() && !idle_.empty()) {
          Worker* other = idle_.back();
          idle_.pop_back();
          other->idle = false;
          other->cv.Signal();
        }
      }
      fn();
    }
  }

  Mutex mu_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  std::vector<Worker*> idle_ GUARDED_BY(mu_);  // most recently idle last
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

class Session;

struct ServerCore {
  HttpServerOptions options;
  HttpServer::Handler handler;
  std::atomic<bool> stopping{false};
  std::atomic<int> connections{0};
  std::atomic<int> pending{0};
  std::atomic<size_t> body_bytes{0};
  std::atomic<int> early{0};          // requests whose body a worker follows (early_paths)
  std::atomic<uint64_t> followed{0};  // such requests so far
  // A worker following a body spins between its pieces (else blocks): with cores to spare.
  const bool early_spin = std::thread::hardware_concurrency() >= 4;
  // One descriptor held in reserve: when the process runs out of descriptors (EMFILE: e.g. an
  // indexer with more sources than its open-file limit allows), accept fails while other threads
  // keep taking every descriptor that frees up, and the API that would report the problem
  // becomes unreachable. The reserve is given up for one accept. A connection that ends while
  // there is no reserve keeps its own descriptor as the reserve (KeepAsSpare): closing it and
  // opening another left a window in which a thread retrying socket() could take the slot, and
  // then every accept waited on luck. (A /register that did not answer in 1 run of 20 under load
  // was first blamed on this window; its cause was the test harness not reading the daemon's
  // stderr: tests/tools/index_command_test.cc.)
  std::atomic<int> spare_fd{-1};
  void ReserveSpare() {
    if (spare_fd.load(std::memory_order_relaxed) >= 0 || stopping.load()) return;
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) KeepAsSpare(fd);
  }
  // Takes `fd` (this server's, no longer used) as the reserve when there is none, else closes it.
  void KeepAsSpare(int fd) {
    int none = -1;
    if (stopping.load() || !spare_fd.compare_exchange_strong(none, fd)) ::close(fd);
  }
  // True when a reserve was given up (an accept may now succeed).
  bool ReleaseSpare() {
    const int fd = spare_fd.exchange(-1);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }
  Mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions GUARDED_BY(mu);
  // Declared after what sessions touch when they are destroyed (with the io_context).
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc};
  std::unique_ptr<HandlerPool> workers;
  std::unique_ptr<HandlerPool> priority;
  std::thread io_thread;
  int port = 0;
  bool stopped = false;

  void Accept();
};

constexpr size_t kSmallBody = 64u << 10;
constexpr size_t kLargeReadBytes = 256u << 10;
constexpr size_t kEarlyReadBytes = 128u << 10;  // a followed body's pieces (MaybeDispatchEarly)

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerCore* srv, tcp::socket socket)
      : srv_(srv), stream_(std::move(socket)), body_bytes_(&srv->body_bytes) {
    srv_->connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() {
    {
      MutexLock lock(&socket_mu_);
      CloseSocket();
    }
    srv_->ReserveSpare();  // when the descriptor went before (a close that failed to release it)
    srv_->connections.fetch_sub(1, std::memory_order_relaxed);
    MutexLock lock(&srv_->mu);
    srv_->sessions.erase(this);
  }

  void Start() {
    {
      MutexLock lock(&srv_->mu);
      srv_->sessions.emplace(this, weak_from_this());
    }
    beast::error_code ignored;
    // An answer is one write, but a streamed one is many small ones: none waits for an ACK.
    stream_.socket().set_option(tcp::no_delay(true), ignored);
    // A worker's direct write (WriteFromWorker) must never block; asynchronous operations do not
    // depend on this mode.
    stream_.socket().non_blocking(true, ignored);
    ReadHeader(srv_->options.header_timeout_ms);
  }

  // On the I/O thread: ends the connection (Stop).
  void Close() {
    if (arrival_ != nullptr) std::exchange(arrival_, nullptr)->Fail();  // a follower lets go
    MutexLock lock(&socket_mu_);  // not while a worker writes to it
    CloseSocket();
  }

 private:
  const HttpServerOptions& opt() const { return srv_->options; }

  // Ends the connection (pending operations complete with operation_aborted). Its descriptor is
  // taken out of the socket, shut down, and kept as the server's reserve when there is none
  // (ServerCore::KeepAsSpare): the slot passes to the reserve without being free in between.
  void CloseSocket() EXCLUSIVE_LOCKS_REQUIRED(socket_mu_) {
    auto& socket = stream_.socket();
    if (socket.is_open()) {
      beast::error_code ec;
      socket.shutdown(tcp::socket::shutdown_both, ec);
      const int fd = socket.release(ec);  // cancels its operations; the socket is then closed
      if (!ec && fd >= 0) srv_->KeepAsSpare(fd);
    }
    stream_.close();  // the timer; the socket too when release failed
  }

  void ReadHeader(int timeout_ms) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(opt().max_header_bytes));
    parser_->body_limit(opt().max_body_bytes);
    // A chunked body claims its bytes chunk by chunk (the parser enforces max_body_bytes).
    chunk_header_ = [this](std::uint64_t size, beast::string_view, beast::error_code& ec) {
      if (size != 0 && !body_bytes_.Claim(size, opt().max_body_bytes_in_flight)) {
        ec = asio::error::no_buffer_space;
      }
    };
    parser_->on_chunk_header(chunk_header_);
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return Fail(ec);
    const auto& req = parser_->get();
    if (auto declared = parser_->content_length()) {
      if (!body_bytes_.Claim(*declared, opt().max_body_bytes_in_flight)) {
        return Fail(asio::error::no_buffer_space);
      }
    }
    if (parser_->is_done()) return OnBody({});
    const auto length = parser_->content_length();
    std::function<void()> read_body;
    if (length && !parser_->chunked() && *length <= opt().max_body_bytes) {
      // A body of known length goes straight into the request's string: what already arrived
      // behind the header is copied out of the buffer, the rest is read into place by as few
      // reads as the socket allows (the parser's path reads at most 64 KiB per call through the
      // buffer, then copies each piece into the body).
      body_.clear();
      body_.resize(static_cast<size_t>(*length));
      const size_t have = std::min(buffer_.size(), body_.size());
      asio::buffer_copy(asio::buffer(body_.data(), have), buffer_.data());
      buffer_.consume(have);
      if (have == body_.size()) return OnDirectBody({});
      MaybeDispatchEarly(have);
      read_body = [self = shared_from_this(), have, arrival = arrival_] {
        self->stream_.expires_after(std::chrono::milliseconds(self->opt().body_timeout_ms));
        // Each read takes all the socket holds, up to the rest of the body (asio's own
        // completion conditions stop every read at 64 KiB: 13 reads and scheduler rounds for
        // an 820 kB body the socket already holds); a body a worker follows is read 128 KiB at a
        // time, each piece announced to it as it lands.
        asio::async_read(
            self->stream_, asio::buffer(self->body_.data() + have, self->body_.size() - have),
            [arrival, have](const beast::error_code& e, size_t n) -> size_t {
              if (arrival == nullptr) return e ? 0 : size_t{1} << 30;
              arrival->Progress(have + n);
              return e ? 0 : kEarlyReadBytes;
            },
            [self](beast::error_code e, size_t) { self->OnDirectBody(e); });
      };
    } else {
      // Chunked: each read fills what the buffer has room for: from a few KiB after the header,
      // a 57 MB body took ~28 000 reads. Large bodies read 256 KiB at a time (given back after
      // the request).
      if (!length || *length > kSmallBody) buffer_.reserve(kLargeReadBytes);
      read_body = [self = shared_from_this()] {
        self->stream_.expires_after(std::chrono::milliseconds(self->opt().body_timeout_ms));
        http::async_read(self->stream_, self->buffer_, *self->parser_,
                         [self](beast::error_code e, size_t) { self->OnBody(e); });
      };
    }
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      // curl sends this for bodies over 1 KiB and waits a second for the go-ahead.
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(std::chrono::milliseconds(opt().write_timeout_ms));
      asio::async_write(stream_, asio::buffer(kContinue, sizeof kContinue - 1),
                        [self = shared_from_this(), read_body](beast::error_code e, size_t) {
                          if (e) return self->Fail(e);
                          read_body();
                        });
      return;
    }
    read_body();
  }

  // The parser's path (chunked bodies; no body).
  void OnBody(beast::error_code ec) {
    if (ec) return Fail(ec);
    stream_.expires_never();
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
    if (buffer_.capacity() > kSmallBody) buffer_.shrink_to_fit();
    HttpRequest r;
    r.method = std::string(req.method_string());
    beast::string_view target = req.target();
    r.path = std::string(target.substr(0, target.find('?')));
    r.body = std::move(req.body());
    Dispatch(std::move(r), req.keep_alive());
  }

  // A body of known length read into body_ (the parser holds the header).
  void OnDirectBody(beast::error_code ec) {
    if (ec) {
      // A peer that closes mid-body: as the parser's path reports it.
      if (ec == asio::error::eof) ec = http::error::partial_message;
      return Fail(ec);
    }
    stream_.expires_never();
    if (arrival_ != nullptr) {
      // A worker follows this body: from here on it and the header's request are the worker's.
      parser_.reset();
      std::exchange(arrival_, nullptr)->Complete(body_.size());
      return;
    }
    const auto& head = parser_->get();
    HttpRequest r;
    r.method = std::string(head.method_string());
    beast::string_view target = head.target();
    r.path = std::string(target.substr(0, target.find('?')));
    r.body = std::move(body_);
    body_ = std::string();
    const bool keep_alive = head.keep_alive();
    parser_.reset();
    Dispatch(std::move(r), keep_alive);
  }

  static bool Listed(const std::vector<std::string>& paths, const std::string& path) {
    return std::find(paths.begin(), paths.end(), path) != paths.end();
  }

  // Counts a request as pending; false (not counted) when too many wait and it is not a priority
  // request.
  bool TakePending(bool priority) {
    if (srv_->pending.fetch_add(1, std::memory_order_relaxed) >= opt().max_pending_requests &&
        !priority) {
      srv_->pending.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }

  // On the I/O thread: hands a complete request to a worker (or refuses it when too many wait).
  void Dispatch(HttpRequest r, bool keep_alive) {
    const bool priority = Listed(opt().priority_paths, r.path);
    if (!TakePending(priority)) {
      body_bytes_.Release();
      return Respond(Error(503, "server busy: " + std::to_string(opt().max_pending_requests) +
                                    " requests are waiting; retry later"),
                     false);
    }
    auto task = [self = shared_from_this(), r = std::move(r), keep_alive]() mutable {
      self->Serve(std::move(r), keep_alive);
    };
    (priority ? srv_->priority : srv_->workers)->Schedule(std::move(task));
  }

  // On the I/O thread, once the header is read and `have` bytes of a body of known length are in
  // body_: hands the request to a worker now when its path is an early one and a slot is free
  // (HttpServerOptions::early_paths); the worker follows the body and serves the request when
  // OnDirectBody completes it. Otherwise (arrival_ stays null) the body is read first.
  void MaybeDispatchEarly(size_t have) {
    const auto& head = parser_->get();
    beast::string_view target = head.target();
    std::string path(target.substr(0, target.find('?')));
    if (body_.size() < kSmallBody || body_.size() > Arrival::kMaxBytes ||
        !Listed(opt().early_paths, path) || Listed(opt().priority_paths, path)) {
      return;
    }
    if (srv_->early.fetch_add(1, std::memory_order_relaxed) >= opt().max_early_requests) {
      srv_->early.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    if (!TakePending(false)) {
      srv_->early.fetch_sub(1, std::memory_order_relaxed);
      return;  // read it first: Dispatch then refuses it (or finds room)
    }
    arrival_ = std::make_shared<Arrival>(have);
    srv_->followed.fetch_add(1, std::memory_order_relaxed);
    HttpRequest r;
    r.method = std::string(head.method_string());
    r.path = std::move(path);
    const bool handler_reads = Listed(opt().arriving_paths, r.path);
    auto task = [self = shared_from_this(), arrival = arrival_, data = body_.data(),
                 size = body_.size(), have, handler_reads, r = std::move(r),
                 keep_alive = head.keep_alive()]() mutable {
      const bool spin = self->srv_->early_spin;
      HttpResponse out;
      // Lives until the answer's after_sent has run: a thread the handler shared it with may
      // read it until then.
      const BodyInPlace body(arrival.get(), data, size, spin);
      if (handler_reads) {
        r.arriving = &body;
        out = self->RunHandler(r);
        r.arriving = nullptr;
      }
      const bool complete = handler_reads ? arrival->Wait(spin) : arrival->Follow(data, have, spin);
      self->srv_->early.fetch_sub(1, std::memory_order_relaxed);
      if (!complete) {
        // The read failed: the I/O thread's Fail released the body's claim and ended the
        // connection; body_ may still be written by a read being cancelled (past what the
        // handler was shown), and is not given back before this task (which holds the
        // connection) ends. The answer, if any, is dropped.
        if (out.after_sent) out.after_sent();
        self->srv_->pending.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      r.body = std::exchange(self->body_, std::string());
      if (!handler_reads) out = self->RunHandler(r);
      self->Answer(std::move(r), std::move(out), keep_alive);
    };
    srv_->workers->Schedule(std::move(task));
  }

  // On a worker: runs the handler on a complete request and answers it.
  void Serve(HttpRequest r, bool keep_alive) {
    HttpResponse out = RunHandler(r);
    Answer(std::move(r), std::move(out), keep_alive);
  }

  // On a worker: the handler's answer (a 503 once the server stops, a 500 for an exception).
  HttpResponse RunHandler(const HttpRequest& r) {
    if (srv_->stopping.load()) return Error(503, "server stopping");
    try {
      return srv_->handler(r);
    } catch (const std::exception& e) {
      KVO_LOG_ERROR("http {} {}: {}", r.method, r.path, e.what());
      return Error(500, "internal error");
    }
  }

  // On a worker: frees the request and its claims, then sends `out`. With an after_sent, the
  // body's memory is kept until that has run (its claim still goes now: the I/O thread claims the
  // connection's next body once the answer is out).
  void Answer(HttpRequest r, HttpResponse out, bool keep_alive) {
    std::function<void()> after = std::move(out.after_sent);
    std::string body = std::move(r.body);
    if (!after) body = std::string();  // the body's memory goes before its claim does
    body_bytes_.Release();
    srv_->pending.fetch_sub(1, std::memory_order_relaxed);
    Send(std::move(out), keep_alive);
    if (after) after();
  }

  void Send(HttpResponse out, bool keep_alive) {
    if (out.stream) return StreamOnWorker(out, keep_alive);
    RespondFromWorker(std::move(out), keep_alive);
  }

  // On a worker: writes the header, runs the producer (each chunk a blocking write through the
  // I/O thread), the last chunk, then goes back to reading (or closes) on the I/O thread.
  void StreamOnWorker(const HttpResponse& out, bool keep_alive) {
    keep_alive = keep_alive && !srv_->stopping.load();
    const auto status = static_cast<http::status>(out.status);
    std::string head = "HTTP/1.1 " + std::to_string(out.status) + " " +
                       std::string(http::obsolete_reason(status)) +
                       "\r\nContent-Type: " + out.content_type +
                       "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: " +
                       (keep_alive ? "keep-alive" : "close") + "\r\n\r\n";
    bool ok = WriteBlocking(std::move(head));
    ChunkWriter writer = [this, &ok](std::string_view data) {
      if (!ok || srv_->stopping.load()) return ok = false;
      if (data.empty()) return true;
      char size[20];
      auto [end, ec] = std::to_chars(size, size + sizeof size, data.size(), 16);
      std::string chunk(size, end);
      chunk.reserve(chunk.size() + data.size() + 4);
      chunk += "\r\n";
      chunk += data;
      chunk += "\r\n";
      return ok = WriteBlocking(std::move(chunk));
    };
    try {
      out.stream(writer);
    } catch (const std::exception& e) {
      // The status is sent: all that is left is to end the connection without the last chunk.
      KVO_LOG_ERROR("http stream: {}", e.what());
      ok = false;
    }
    if (ok) ok = WriteBlocking("0\r\n\r\n");
    asio::post(stream_.get_executor(), [self = shared_from_this(), ok, keep_alive] {
      if (!ok || !keep_alive || self->srv_->stopping.load()) return self->Close();
      self->ReadHeader(self->opt().keep_alive_timeout_ms);
    });
  }

  // On a worker: the answer goes out from here, without waiting for the I/O thread (a hand-off
  // that costs a wake-up, a large share of a small request's round trip on a busy host): the
  // socket is idle (nothing is read until the answer is out) and non-blocking, so one writev
  // sends what the socket takes at once; only a remainder (a large answer to a slow reader) is
  // written by the I/O thread under write_timeout_ms. The I/O thread then reads the next request.
  void RespondFromWorker(HttpResponse out, bool keep_alive) {
    keep_alive = keep_alive && !srv_->stopping.load();
    if (out.status < 200 || out.status == 204 || out.status == 304) out.body.clear();
    auto msg = std::make_shared<std::pair<std::string, std::string>>(
        ResponseHead(out.status, out.content_type, out.body.size(), keep_alive),
        std::move(out.body));
    size_t sent = 0;
    bool failed = false;
    {
      MutexLock lock(&socket_mu_);
      beast::error_code ec;
      const std::array<asio::const_buffer, 2> bufs = {asio::buffer(msg->first),
                                                      asio::buffer(msg->second)};
      sent = stream_.socket().write_some(bufs, ec);  // one sendmsg; never blocks
      failed = ec && ec != asio::error::would_block && ec != asio::error::try_again;
    }
    asio::post(stream_.get_executor(), [self = shared_from_this(), msg, sent, failed, keep_alive] {
      if (failed || self->srv_->stopping.load()) return self->Close();
      const size_t head = msg->first.size();
      const size_t total = head + msg->second.size();
      if (sent == total) {
        if (!keep_alive) return self->Close();
        return self->ReadHeader(self->opt().keep_alive_timeout_ms);
      }
      std::array<asio::const_buffer, 2> rest = {
          asio::buffer(msg->first) + std::min(sent, head),
          asio::buffer(msg->second) + (sent > head ? sent - head : 0)};
      self->stream_.expires_after(std::chrono::milliseconds(self->opt().write_timeout_ms));
      asio::async_write(self->stream_, rest, [self, msg, keep_alive](beast::error_code e, size_t) {
        if (e || !keep_alive || self->srv_->stopping.load()) return self->Close();
        self->ReadHeader(self->opt().keep_alive_timeout_ms);
      });
    });
  }

  // The status line and headers of an answer with a body of `length` bytes (as Beast's
  // prepare_payload writes them: no Content-Length on a status that has no body).
  static std::string ResponseHead(int status, const std::string& content_type, size_t length,
                                  bool keep_alive) {
    std::string head = "HTTP/1.1 ";
    head += std::to_string(status);
    head += ' ';
    const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
    head.append(reason.data(), reason.size());
    head += "\r\nContent-Type: ";
    head += content_type;
    if (status >= 200 && status != 204 && status != 304) {
      head += "\r\nContent-Length: ";
      head += std::to_string(length);
    }
    head += keep_alive ? "\r\n\r\n" : "\r\nConnection: close\r\n\r\n";
    return head;
  }

  // From a worker: one write on the I/O thread, waited for. False on any error or timeout.
  bool WriteBlocking(std::string data) {
    auto done = std::make_shared<std::promise<bool>>();
    auto result = done->get_future();
    auto buf = std::make_shared<std::string>(std::move(data));
    asio::post(stream_.get_executor(), [self = shared_from_this(), buf, done] {
      self->stream_.expires_after(std::chrono::milliseconds(self->opt().write_timeout_ms));
      asio::async_write(self->stream_, asio::buffer(*buf),
                        [buf, done](beast::error_code ec, size_t) { done->set_value(!ec); });
    });
    // The I/O thread runs until the workers are joined (Stop), so the write completes or times
    // out; the margin only guards against a stalled I/O thread.
    if (result.wait_for(std::chrono::milliseconds(opt().write_timeout_ms) +
                        std::chrono::seconds(5)) != std::future_status::ready) {
      return false;
    }
    return result.get();
  }

  static HttpResponse Error(int status, const std::string& message) {
    return HttpResponse{status, "application/json", ErrorBody(message)};
  }

  // Maps a read error to an answer, or closes quietly when there is no one to answer.
  void Fail(beast::error_code ec) {
    if (arrival_ != nullptr) std::exchange(arrival_, nullptr)->Fail();  // a follower lets go
    body_bytes_.Release();
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof || ec == http::error::partial_message || srv_->stopping.load()) {
      return Close();
    }
    if (ec == http::error::body_limit) {
      return Respond(Error(413, "request body larger than the limit of " +
                                    std::to_string(opt().max_body_bytes) + " bytes"),
                     false, true);
    }
    if (ec == http::error::header_limit) {
      return Respond(Error(431, "request header larger than the limit of " +
                                    std::to_string(opt().max_header_bytes) + " bytes"),
                     false, true);
    }
    if (ec == asio::error::no_buffer_space) {
      return Respond(
          Error(503, "server busy: request bodies in flight would pass " +
                         std::to_string(opt().max_body_bytes_in_flight) + " bytes; retry later"),
          false, true);
    }
    Respond(Error(400, "malformed HTTP request: " + ec.message()), false, true);
  }

  // `keep_alive` false after a refusal: the client may still be sending what we did not read.
  void Respond(HttpResponse out, bool keep_alive, bool unread_input = false) {
    keep_alive = keep_alive && !srv_->stopping.load();
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(11);
    res->result(static_cast<unsigned>(out.status));
    res->set(http::field::content_type, out.content_type);
    res->body() = std::move(out.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(std::chrono::milliseconds(opt().write_timeout_ms));
    http::async_write(
        stream_, *res,
        [self = shared_from_this(), res, keep_alive, unread_input](beast::error_code ec, size_t) {
          if (!ec && unread_input) return self->Linger();
          if (ec || !keep_alive) return self->Close();
          self->ReadHeader(self->opt().keep_alive_timeout_ms);
        });
  }

  // Closing a socket with unread input sends a reset, which may destroy the answer before the
  // client reads it: half-close, discard what still arrives (bounded in time), then close.
  void Linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(2));
    Discard();
  }
  void Discard() {
    stream_.async_read_some(asio::buffer(discard_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->Discard();
                            });
  }

  ServerCore* srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> chunk_header_;
  BodyBytes body_bytes_;
  std::string body_;  // a body of known length being read (OnDirectBody)
  // Set while a worker follows body_ (MaybeDispatchEarly): body_ and the request are then the
  // worker's once OnDirectBody completes it.
  std::shared_ptr<Arrival> arrival_;
  // Held by a worker writing its answer (RespondFromWorker) and by Close (the I/O thread: Stop).
  Mutex socket_mu_;
  std::array<char, 4096> discard_{};
};

void ServerCore::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!acceptor.is_open() || stopping.load()) return;
      if ((ec.value() == EMFILE || ec.value() == ENFILE) && ReleaseSpare()) {
        KVO_LOG_WARN("http accept: {}; accepting with the reserved descriptor", ec.message());
        return Accept();
      }
      // EMFILE and friends: log, and try again shortly (not at once: that would spin).
      KVO_LOG_WARN("http accept: {}", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code e) {
        if (!e) Accept();
      });
      return;
    } else if (connections.load(std::memory_order_relaxed) >= options.max_connections) {
      // Answer without reading: the socket's send buffer is empty, so this never blocks.
      static const std::string kBusy = [] {
        std::string body = ErrorBody("too many connections; retry later");
        return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
               "Connection: close\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      beast::error_code ignored;
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(kBusy), ignored);
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    } else {
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  });
}

}  // namespace

std::optional<std::string_view> WholeBody(const HttpRequest& r) {
  if (r.arriving == nullptr) return std::string_view(r.body);
  const size_t size = r.arriving->size();
  for (size_t have = 0; have < size;) {
    const size_t now = r.arriving->WaitBeyond(have);
    if (now <= have) return std::nullopt;
    have = now;
  }
  return std::string_view(r.arriving->data(), size);
}

struct HttpServer::Impl : ServerCore {};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

uint64_t HttpServer::followed_bodies() const {
  return impl_->followed.load(std::memory_order_relaxed);
}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                      Handler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  const std::string where = options.address.host + ":" + std::to_string(options.address.port);
  beast::error_code ec;
  auto address = asio::ip::make_address(options.address.host, ec);
  if (ec) {
    // A name (localhost): resolve it.
    tcp::resolver resolver(impl->ioc);
    auto results = resolver.resolve(options.address.host, "", ec);
    if (ec || results.empty()) {
      return Status::Unavailable("HTTP server: cannot resolve '" + options.address.host +
                                 "': " + (ec ? ec.message() : std::string("no address")));
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, static_cast<unsigned short>(options.address.port));
  tcp::acceptor& a = impl->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);  // SOMAXCONN
  if (!ec) impl->port = a.local_endpoint(ec).port();
  if (ec || impl->port <= 0) {
    return Status::Unavailable("HTTP server: cannot bind " + where + ": " +
                               (ec ? ec.message() : std::string("no port")));
  }
  impl->workers = std::make_unique<HandlerPool>(std::max(options.worker_threads, 1), "kvo-http");
  impl->priority = std::make_unique<HandlerPool>(1, "kvo-http-prio");
  impl->ReserveSpare();
  impl->Accept();
  Impl* raw = impl.get();
  impl->io_thread = std::thread([raw] {
    for (;;) {
      try {
        raw->ioc.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw (it should not): log and keep serving.
        KVO_LOG_ERROR("http server: {}", e.what());
      }
    }
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  Impl* s = impl_.get();
  s->stopping = true;
  // 1. On the I/O thread: stop accepting, close every connection (pending reads fail at once).
  auto closed = std::make_shared<std::promise<void>>();
  asio::post(s->ioc, [s, closed] {
    beast::error_code ignored;
    s->acceptor.close(ignored);
    s->accept_retry.cancel();
    std::vector<std::shared_ptr<Session>> live;
    {
      MutexLock lock(&s->mu);
      for (auto& [raw, weak] : s->sessions) {
        if (auto p = weak.lock()) live.push_back(std::move(p));
      }
    }
    for (auto& p : live) p->Close();
    closed->set_value();
  });
  closed->get_future().wait_for(std::chrono::seconds(10));
  // 2. Wait for running handlers; queued ones see `stopping` and skip the handler.
  s->priority.reset();
  s->workers.reset();
  // 3. The I/O thread; sessions still referenced by queued completions go with the io_context.
  s->ioc.stop();
  if (s->io_thread.joinable()) s->io_thread.join();
  s->ReleaseSpare();
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

Result<HttpClientResult> HttpStreamCall(const HttpAddress& address, const std::string& method,
                                        const std::string& path, const std::string& body,
                                        int timeout_ms, const ChunkReceiver& on_chunk) {
  const std::string where =
      "HTTP " + method + " http://" + address.host + ":" + std::to_string(address.port) + path;
  if (method != "GET" && method != "POST") {
    return Status::InvalidArgument("HttpStreamCall: unsupported method '" + method + "'");
  }
  try {
    httplib::Client client(address.host, address.port);
    auto timeout = std::chrono::milliseconds(timeout_ms);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Request req;
    req.method = method;
    req.path = path;
    if (method == "POST") {
      req.body = body;
      req.headers.emplace("Content-Type", "application/json");
    }
    bool stopped = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (on_chunk(std::string_view(data, n))) return true;
      stopped = true;
      return false;
    };
    httplib::Result res = client.send(req);
    if (stopped) return Status::Cancelled(where + ": stopped by the receiver");
    if (!res) return Status::Unavailable(where + ": " + httplib::to_string(res.error()));
    return HttpClientResult{res->status, {}};
  } catch (const std::exception& e) {
    return Status::Unavailable(where + ": " + e.what());
  }
}

Result<HttpAddress> ParseHttpUrl(std::string_view url) {
  std::string_view rest = url;
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  if (rest.starts_with("https://")) {
    return Status::InvalidArgument("URL '" + std::string(url) + "': https is not supported");
  }
  rest = rest.substr(0, rest.find('/'));
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("URL '" + std::string(url.substr(0, 200)) + "': " + why +
                                   " (expected http://HOST:PORT)");
  };
  HttpAddress a;
  std::string_view port_text;
  if (rest.starts_with("[")) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return bad("bad IPv6 form");
    }
    a.host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    a.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  if (a.host.empty()) return bad("no host");
  int port = -1;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 1 || port > 65535) {
    return bad("port must be 1-65535");
  }
  a.port = port;
  return a;
}

}  // namespace kvo
