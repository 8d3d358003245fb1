// kvo._kvo's file tier (kvo.FsTier, under vLLM's CPU tier as kvo.vllm.KvoFsTier) and transfer
// engine (kvo.TransferEngine, the worker's data path). The binding-edge rules are in kvo_module.cc.
#include "python/src/module_internal.h"

namespace kvo::python {
namespace {

// ---- one file tier on its own (kvo.vllm.KvoFsTier under vLLM's CPU tier) -------------------

class PyFsTier {
 public:
  // The geometry is the primary view's, as vLLM's file tier takes it: one row per block of
  // `row_bytes` (the view's first stride), as many rows as the view holds; blocks_per_chunk
  // names the files' namespace (vLLM's blocks_per_file). `config_json` holds the one fs tier.
  PyFsTier(const std::string& config_json, uint64_t row_bytes, uint64_t blocks_per_chunk,
           const FsRunFields& run, uint32_t rank, py::object rows, bool enable_kv_cache_events) {
    OffloadConfig c = Unwrap(ParseOffloadConfig(config_json));
    if (c.secondary_tiers.size() != 1 || c.secondary_tiers[0].type != "fs") {
      throw py::value_error("secondary_tiers: expected one fs tier");
    }
    if (row_bytes == 0) throw py::value_error("primary_kv_view: rows of 0 bytes");
    if (blocks_per_chunk == 0) throw py::value_error("blocks_per_chunk: must be > 0");
    HostRegion region = rows_.Adopt(std::move(rows), row_bytes, "primary_kv_view");
    if (region.num_slots == 0) {
      throw py::value_error("primary_kv_view: " + std::to_string(region.bytes()) +
                            " bytes hold no row of " + std::to_string(row_bytes) + " bytes");
    }
    geometry_.row_bytes = row_bytes;
    geometry_.num_blocks = region.num_slots;
    geometry_.blocks_per_chunk = blocks_per_chunk;
    tier_ = Unwrap(BuildFsTier(c.secondary_tiers[0].fs, run, rank, geometry_, region,
                               enable_kv_cache_events, "KvoFsTier"));
  }

  py::object Lookup(py::handle key, py::handle ctx) {
    OffloadKey k = KeyFromObject(key.ptr(), "key");
    ContextFrom(ctx, &ctx_);
    return py::reinterpret_borrow<py::object>(
        g_lookup_values[static_cast<int>(T().Lookup(k, ctx_))]);
  }

  void Submit(bool store, uint64_t job_id, py::handle keys, py::handle slots, py::handle ctx) {
    TierJob job;
    job.job_id = job_id;
    KeysFromIterable(keys, "keys", &job.keys);
    job.is_promotion = !store;
    std::vector<int64_t> s = py::reinterpret_borrow<py::object>(slots).cast<std::vector<int64_t>>();
    if (s.size() != job.keys.size()) {
      throw py::value_error("block_ids: " + std::to_string(s.size()) + " slots for " +
                            std::to_string(job.keys.size()) + " keys");
    }
    for (int64_t v : s) {
      if (v < 0 || static_cast<uint64_t>(v) >= geometry_.num_blocks) {
        throw py::value_error("block_ids: a slot outside the CPU tier's " +
                              std::to_string(geometry_.num_blocks) + " rows");
      }
      job.slots.push_back(static_cast<int32_t>(v));
    }
    ContextFrom(ctx, &ctx_);
    job.req_id = ctx_.req_id;
    Check(store ? T().SubmitStore(job) : T().SubmitLoad(job));
  }

  // [(job_id, success, successful_keys | None, lost_keys)]
  py::list TakeFinished() {
    results_.clear();
    T().TakeFinished(&results_);
    py::list out;
    for (const JobResult& r : results_) {
      py::object ok = r.successful_keys ? py::object(KeysToList(*r.successful_keys)) : py::none();
      out.append(py::make_tuple(r.job_id, r.success, ok, KeysToList(r.lost_keys)));
    }
    return out;
  }

  // [(keys, medium, removed, locality, reason)]
  py::list TakeEvents() {
    events_.clear();
    T().TakeEvents(&events_);
    py::list out;
    for (const OffloadingEvent& e : events_) {
      out.append(py::make_tuple(KeysToList(e.keys), std::string(MediumName(e.medium)), e.removed(),
                                e.locality, std::string(RemovalReasonName(e.reason()))));
    }
    return out;
  }

  void Drain() {
    py::gil_scoped_release release;
    T().Drain();
  }
  void Touch(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_);
    T().Touch(keys_, ctx_);
  }
  std::string OnNewRequest(py::handle ctx) {
    ContextFrom(ctx, &ctx_);
    return T().OnNewRequest(ctx_) == OffloadPolicy::kRequestLevel ? "request_level" : "block_level";
  }
  void OnRequestFinished(py::handle ctx) {
    ContextFrom(ctx, &ctx_);
    T().OnRequestFinished(ctx_);
  }
  void OnScheduleEnd() { T().OnScheduleEnd(); }
  bool HasPendingWork() { return T().HasPendingWork(); }
  py::list ListHeld() {
    keys_.clear();
    T().ListHeld(&keys_);
    return KeysToList(keys_);
  }
  uint64_t row_bytes() const { return geometry_.row_bytes; }
  uint64_t num_blocks() const { return geometry_.num_blocks; }
  void Shutdown() {
    if (!tier_) return;
    Drain();
    tier_.reset();
  }

 private:
  SecondaryTier& T() {
    if (!tier_) PyErr_SetString(g_contract_error, "the tier was shut down");
    if (!tier_) throw py::error_already_set();
    return *tier_;
  }
  Rows rows_;
  std::shared_ptr<SecondaryTier> tier_;
  OffloadGeometry geometry_;
  std::vector<OffloadKey> keys_;
  RequestContext ctx_;
  std::vector<JobResult> results_;
  std::vector<OffloadingEvent> events_;
};

// ---- the transfer engine (the worker's data path) ------------------------------------------

class PyEngine {
 public:
  // tensors: [(data_ptr, num_blocks, block_stride, page_bytes)]; groups: [[(tensor_idx,
  // copy_bytes)]]; rows: (base, num_slots, row_stride) of the host region.
  PyEngine(const std::string& name,
           const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t, uint64_t>>& tensors,
           const std::vector<std::vector<std::pair<uint32_t, uint64_t>>>& groups,
           uint32_t blocks_per_chunk, uint32_t num_workers, uint32_t worker_index,
           uint64_t host_page_size, py::object rows, int num_threads, uintptr_t compute_stream,
           int device) {
    KvLayoutSpec spec;
    for (const auto& [base, n, stride, page] : tensors) {
      spec.tensors.push_back(KvTensorLayout{base, n, stride, page});
    }
    for (const auto& g : groups) {
      KvGroupLayout gl;
      for (const auto& [t, copy] : g) gl.refs.push_back(KvGroupRef{t, copy});
      spec.groups.push_back(std::move(gl));
    }
    spec.blocks_per_chunk = blocks_per_chunk;
    spec.num_workers = num_workers;
    spec.worker_index = worker_index;
    spec.host_page_size = host_page_size;
    layout_ = std::make_unique<KvLayout>(Unwrap(KvLayout::Create(std::move(spec))));
    TransferEngineOptions eo;
    eo.num_threads = num_threads;
    eo.compute_stream = compute_stream;
    eo.device = device;
    engine_ = Unwrap(MakeTransferEngine(name, eo));
    region_ = rows_.Adopt(std::move(rows), layout_->row_stride(), "rows");
    Check(engine_->RegisterLayout(*layout_, region_));
  }

  uint64_t row_stride() const { return layout_->row_stride(); }
  uint64_t num_slots() const { return region_.num_slots; }
  std::string name() const { return std::string(engine_->name()); }

  // One block-level job; returns its engine job id.
  uint64_t Submit(bool store, std::vector<int64_t> gpu_block_ids, std::vector<uint32_t> group_sizes,
                  std::vector<uint64_t> block_indices, std::vector<int64_t> cpu_slots) {
    TransferRequest req;
    req.direction = store ? TransferDirection::kGpuToCpu : TransferDirection::kCpuToGpu;
    BlockTransferSpec spec;
    spec.gpu_block_ids = std::move(gpu_block_ids);
    spec.group_sizes = std::move(group_sizes);
    spec.block_indices = std::move(block_indices);
    spec.cpu_slots = std::move(cpu_slots);
    req.blocks = std::move(spec);
    return Unwrap(engine_->Submit(std::move(req)));
  }

  // [(job_id, success, bytes, seconds, error message)]
  py::list TakeFinished() {
    results_.clear();
    engine_->TakeFinished(&results_);
    py::list out;
    for (const TransferResult& r : results_) {
      out.append(py::make_tuple(r.job_id, r.success, r.bytes, r.seconds,
                                r.success ? std::string() : r.status.ToString()));
    }
    return out;
  }

  // Blocks (GIL released) until the job finished; its result stays queued. False + message on a
  // failed job.
  py::tuple Wait(uint64_t job) {
    Status s;
    {
      py::gil_scoped_release release;
      s = engine_->Wait(job);
    }
    if (s.code() == StatusCode::kNotFound) return py::make_tuple(true, std::string());
    return py::make_tuple(s.ok(), s.ok() ? std::string() : s.ToString());
  }

  void Drain() {
    py::gil_scoped_release release;
    engine_->Drain();
  }

 private:
  Rows rows_;
  std::unique_ptr<KvLayout> layout_;
  HostRegion region_;
  std::unique_ptr<TransferEngine> engine_;
  std::vector<TransferResult> results_;
};

}  // namespace

void BindFsTierAndEngine(py::module_& m) {
  py::class_<PyEngine>(m, "TransferEngine",
                       "kvo's transfer engine over registered KV tensors and host rows")
      .def(py::init<const std::string&,
                    const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t, uint64_t>>&,
                    const std::vector<std::vector<std::pair<uint32_t, uint64_t>>>&, uint32_t,
                    uint32_t, uint32_t, uint64_t, py::object, int, uintptr_t, int>(),
           py::arg("name"), py::arg("tensors"), py::arg("groups"), py::arg("blocks_per_chunk"),
           py::arg("num_workers"), py::arg("worker_index"), py::arg("host_page_size"),
           py::arg("rows"), py::arg("num_threads") = 4, py::arg("compute_stream") = 0,
           py::arg("device") = 0)
      .def_property_readonly("row_stride", &PyEngine::row_stride)
      .def_property_readonly("num_slots", &PyEngine::num_slots)
      .def_property_readonly("name", &PyEngine::name)
      .def("submit", &PyEngine::Submit, py::arg("store"), py::arg("gpu_block_ids"),
           py::arg("group_sizes"), py::arg("block_indices"), py::arg("cpu_slots"))
      .def("get_finished", &PyEngine::TakeFinished)
      .def("wait", &PyEngine::Wait, py::arg("job_id"))
      .def("wait_all", &PyEngine::Drain);

  py::class_<PyFsTier>(m, "FsTier",
                       "kvo's file tier (vLLM's layout; bounded, restart-safe, integrity-checked) "
                       "over a CPU tier's rows")
      .def(py::init([](const std::string& json, uint64_t row_bytes, uint64_t blocks_per_chunk,
                       const py::dict& run, py::object rows, bool enable_kv_cache_events) {
             return std::make_unique<PyFsTier>(json, row_bytes, blocks_per_chunk, RunFrom(run),
                                               RankFrom(run), std::move(rows),
                                               enable_kv_cache_events);
           }),
           py::arg("json"), py::arg("row_bytes"), py::arg("blocks_per_chunk"), py::arg("run"),
           py::arg("rows"), py::arg("enable_kv_cache_events"))
      .def("lookup", &PyFsTier::Lookup, py::arg("key"), py::arg("req_context") = py::none())
      .def(
          "submit_store",
          [](PyFsTier& t, uint64_t job_id, py::handle keys, py::handle slots, py::handle ctx) {
            t.Submit(true, job_id, keys, slots, ctx);
          },
          py::arg("job_id"), py::arg("keys"), py::arg("block_ids"),
          py::arg("req_context") = py::none())
      .def(
          "submit_load",
          [](PyFsTier& t, uint64_t job_id, py::handle keys, py::handle slots, py::handle ctx) {
            t.Submit(false, job_id, keys, slots, ctx);
          },
          py::arg("job_id"), py::arg("keys"), py::arg("block_ids"),
          py::arg("req_context") = py::none())
      .def("take_finished", &PyFsTier::TakeFinished)
      .def("take_events", &PyFsTier::TakeEvents)
      .def("drain", &PyFsTier::Drain)
      .def("touch", &PyFsTier::Touch, py::arg("keys"), py::arg("req_context") = py::none())
      .def("on_new_request", &PyFsTier::OnNewRequest, py::arg("req_context"))
      .def("on_request_finished", &PyFsTier::OnRequestFinished, py::arg("req_context"))
      .def("on_schedule_end", &PyFsTier::OnScheduleEnd)
      .def("has_pending_work", &PyFsTier::HasPendingWork)
      .def("list_held", &PyFsTier::ListHeld)
      .def_property_readonly("row_bytes", &PyFsTier::row_bytes)
      .def_property_readonly("num_blocks", &PyFsTier::num_blocks)
      .def("shutdown", &PyFsTier::Shutdown);
}

}  // namespace kvo::python
