// kvo._kvo: the Python extension (pybind11) over kvo's C++ offload manager, file tier and transfer
// engine. The Python package (python/kvo/) re-exports it and adds the vLLM adapters (kvo.vllm).
//
// Binding-edge rules (python/DESIGN.md):
// - A Status error becomes a Python exception here and nowhere else: InvalidArgument -> ValueError,
//   FailedPrecondition -> RuntimeError (kvo.ContractError), NotFound -> FileNotFoundError, I/O ->
//   OSError.
// - Keys are vLLM's OffloadKey bytes: block hash (1..32 bytes) + 4-byte big-endian group. Anything
//   else raises ValueError (TypeError for a non-bytes object) naming the argument; messages carry
//   sizes and type names, never the caller's data.
// - Slot ids go out as numpy int64 arrays and come in as any int sequence / array.
// - The GIL is held for every manager call (the manager is thread-compatible: the GIL is its
//   external mutex). Blocking engine waits release it.
#include "python/src/module_internal.h"

// After module_internal.h (Python.h first).
#include "manager/testing/offload_manager_peer.h"

namespace kvo::python {
namespace {

// ---- enums and value types -----------------------------------------------------------------

// ---- prepare_store's output ----------------------------------------------------------------

// kvo.PrepareStoreOutput: a plain C type (no pybind11 instance machinery: the store path builds one
// per call). keys_to_store and store_slots are built eagerly (vLLM's scheduler reads both on every
// store); evicted_keys, which vLLM's scheduler never reads, stays as C++ keys until first read and
// is then built once and cached.
struct StoreOutputObject {
  PyObject_HEAD PyObject* keys_to_store;  // list of bytes
  PyObject* store_slots;                  // numpy int64 array
  PyObject* evicted;                      // list of bytes once built, else nullptr
  OffloadKey* evicted_keys;               // PyMem_Malloc'ed until `evicted` is built
  Py_ssize_t num_evicted;
};

PyTypeObject* g_store_output_type = nullptr;
static_assert(std::is_trivially_copyable_v<OffloadKey>, "evicted keys are kept as raw bytes");

PyObject* EvictedList(StoreOutputObject* o) {
  if (o->evicted != nullptr) return o->evicted;
  PyObject* l = PyList_New(o->num_evicted);
  if (l == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < o->num_evicted; ++i) {
    PyObject* b = KeyToBytesRaw(o->evicted_keys[i]);
    if (b == nullptr) {
      Py_DECREF(l);
      return nullptr;
    }
    PyList_SET_ITEM(l, i, b);
  }
  o->evicted = l;
  PyMem_Free(o->evicted_keys);
  o->evicted_keys = nullptr;
  o->num_evicted = 0;
  return l;
}

void StoreOutputDealloc(PyObject* self) {
  auto* o = reinterpret_cast<StoreOutputObject*>(self);
  Py_XDECREF(o->keys_to_store);
  Py_XDECREF(o->store_slots);
  Py_XDECREF(o->evicted);
  PyMem_Free(o->evicted_keys);
  PyTypeObject* tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyObject* StoreOutputGetEvicted(PyObject* self, void*) {
  PyObject* l = EvictedList(reinterpret_cast<StoreOutputObject*>(self));
  Py_XINCREF(l);
  return l;
}

PyObject* StoreOutputRepr(PyObject* self) {
  auto* o = reinterpret_cast<StoreOutputObject*>(self);
  Py_ssize_t ev = o->evicted != nullptr ? PyList_GET_SIZE(o->evicted) : o->num_evicted;
  return PyUnicode_FromFormat("PrepareStoreOutput(%zd to store, %zd evicted)",
                              PyList_GET_SIZE(o->keys_to_store), ev);
}

PyMemberDef g_store_output_members[] = {
    {"keys_to_store", T_OBJECT_EX, offsetof(StoreOutputObject, keys_to_store), READONLY,
     "the keys to store (list of bytes), a subsequence of the keys passed"},
    {"store_slots", T_OBJECT_EX, offsetof(StoreOutputObject, store_slots), READONLY,
     "their CPU slots (numpy int64, co-indexed with keys_to_store): the CPULoadStoreSpec"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef g_store_output_getset[] = {{"evicted_keys", StoreOutputGetEvicted, nullptr,
                                        "the keys evicted to make room (list)", nullptr},
                                       {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot g_store_output_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(StoreOutputDealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(StoreOutputRepr)},
    {Py_tp_members, g_store_output_members},
    {Py_tp_getset, g_store_output_getset},
    {Py_tp_doc, const_cast<char*>("vLLM's PrepareStoreOutput; store_slots is the CPU spec")},
    {0, nullptr}};

PyType_Spec g_store_output_spec = {"kvo._kvo.PrepareStoreOutput",
                                   static_cast<int>(sizeof(StoreOutputObject)), 0,
                                   Py_TPFLAGS_DEFAULT, g_store_output_slots};

// ---- events --------------------------------------------------------------------------------

// kvo.OffloadingEvent: vLLM's OffloadingEvent plus kvo's reason and tier, a plain C type
// (take_events builds one per event). Every member is a Python object made at construction.
struct EventObject {
  PyObject_HEAD PyObject* keys;  // list of bytes
  PyObject* medium;              // str
  PyObject* removed;             // bool
  PyObject* locality;            // str or None
  PyObject* reason;              // str
  PyObject* tier;                // int
};

PyTypeObject* g_event_type = nullptr;

void EventDealloc(PyObject* self) {
  auto* e = reinterpret_cast<EventObject*>(self);
  Py_XDECREF(e->keys);
  Py_XDECREF(e->medium);
  Py_XDECREF(e->removed);
  Py_XDECREF(e->locality);
  Py_XDECREF(e->reason);
  Py_XDECREF(e->tier);
  PyTypeObject* tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyObject* EventRepr(PyObject* self) {
  auto* e = reinterpret_cast<EventObject*>(self);
  return PyUnicode_FromFormat("OffloadingEvent(%zd keys, %U%s)", PyList_GET_SIZE(e->keys),
                              e->medium, e->removed == Py_True ? ", removed" : "");
}

#define KVO_EVENT_MEMBER(name, doc) \
  { #name, T_OBJECT_EX, offsetof(EventObject, name), READONLY, doc }
PyMemberDef g_event_members[] = {
    KVO_EVENT_MEMBER(keys, "the keys (list of bytes)"),
    KVO_EVENT_MEMBER(medium, "\"CPU\" | \"STORAGE\""),
    KVO_EVENT_MEMBER(removed, "True for a removal"),
    KVO_EVENT_MEMBER(locality, "\"LOCAL\" | \"REMOTE\" | None"),
    KVO_EVENT_MEMBER(reason,
                     "removals: \"evicted\" | \"failed\" | \"cleared\" | \"restart\" | ..."),
    KVO_EVENT_MEMBER(tier, "0: the CPU tier; i + 1: secondary tier i"),
    {nullptr, 0, 0, 0, nullptr}};
#undef KVO_EVENT_MEMBER

PyType_Slot g_event_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(EventDealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(EventRepr)},
    {Py_tp_members, g_event_members},
    {Py_tp_doc, const_cast<char*>("vLLM's OffloadingEvent plus kvo's reason and tier")},
    {0, nullptr}};

PyType_Spec g_event_spec = {"kvo._kvo.OffloadingEvent", static_cast<int>(sizeof(EventObject)), 0,
                            Py_TPFLAGS_DEFAULT, g_event_slots};

// Interned str objects for the few values event fields take (made once, kept for the process).
PyObject* CachedStr(const std::string& v) {
  static std::vector<std::pair<std::string, PyObject*>> cache;
  for (const auto& [k, o] : cache) {
    if (k == v) {
      Py_INCREF(o);
      return o;
    }
  }
  PyObject* o = PyUnicode_FromStringAndSize(v.data(), static_cast<Py_ssize_t>(v.size()));
  if (o == nullptr) return nullptr;
  if (cache.size() < 32) {
    PyUnicode_InternInPlace(&o);
    Py_INCREF(o);
    cache.emplace_back(v, o);
  }
  return o;
}

// A new list of events (new reference); nullptr with a Python error set.
PyObject* EventsToList(const std::vector<OffloadingEvent>& events) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(events.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    const OffloadingEvent& e = events[i];
    auto* o = reinterpret_cast<EventObject*>(g_event_type->tp_alloc(g_event_type, 0));
    if (o == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), reinterpret_cast<PyObject*>(o));
    o->keys = PyList_New(static_cast<Py_ssize_t>(e.keys.size()));
    if (o->keys == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    for (size_t j = 0; j < e.keys.size(); ++j) {
      PyObject* k = KeyToBytesRaw(e.keys[j]);
      if (k == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
      PyList_SET_ITEM(o->keys, static_cast<Py_ssize_t>(j), k);
    }
    o->medium = CachedStr(std::string(MediumName(e.medium)));
    o->removed = PyBool_FromLong(e.removed() ? 1 : 0);
    if (e.locality) {
      o->locality = CachedStr(*e.locality);
    } else {
      Py_INCREF(Py_None);
      o->locality = Py_None;
    }
    o->reason = CachedStr(std::string(RemovalReasonName(e.reason())));
    o->tier = PyLong_FromLong(e.tier);
    if (o->medium == nullptr || o->locality == nullptr || o->reason == nullptr ||
        o->tier == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

py::dict StatsDict(const ManagerStats& s) {
  py::dict d;
  d["usage"] = s.usage;
  d["write_usage"] = s.write_usage;
  d["read_usage"] = s.read_usage;
  d["num_blocks"] = s.num_blocks;
  d["num_allocated"] = s.num_allocated;
  d["num_free"] = s.num_free;
  d["num_evictable"] = s.num_evictable;
  d["num_pending_writes"] = s.num_pending_writes;
  d["num_stored"] = s.num_stored;
  d["allocation_count"] = s.allocation_count;
  d["allocation_sum"] = s.allocation_sum;
  py::list buckets;
  for (uint64_t b : s.allocation_buckets) buckets.append(b);
  d["allocation_buckets"] = buckets;
  d["stores_skipped"] = s.stores_skipped;
  d["lookups"] = s.lookups;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  d["store_failures"] = s.store_failures;
  d["promotion_allocation_failures"] = s.promotion_allocation_failures;
  d["promotion_job_failures"] = s.promotion_job_failures;
  d["cascade_job_failures"] = s.cascade_job_failures;
  d["active_promotion_jobs"] = s.active_promotion_jobs;
  d["active_cascade_jobs"] = s.active_cascade_jobs;
  d["events_published"] = s.events_published;
  d["event_batches_published"] = s.event_batches_published;
  d["event_errors"] = s.event_errors;
  d["journal_bytes"] = s.journal_bytes;
  py::list tiers;
  for (const TierStats& t : s.tiers) {
    py::dict td;
    td["label"] = t.label;
    td["block_queries"] = t.block_queries;
    td["block_hits"] = t.block_hits;
    td["promotion_job_failures"] = t.promotion_job_failures;
    td["cascade_job_failures"] = t.cascade_job_failures;
    td["active_promotion_jobs"] = t.active_promotion_jobs;
    td["active_cascade_jobs"] = t.active_cascade_jobs;
    td["primary_write_usage"] = t.primary_write_usage;
    td["primary_read_usage"] = t.primary_read_usage;
    tiers.append(td);
  }
  d["tiers"] = tiers;
  return d;
}

// ---- the manager ---------------------------------------------------------------------------

class PyManager {
 public:
  PyManager(size_t num_blocks, const std::string& eviction_policy, int64_t store_threshold,
            size_t max_tracker_size, bool enable_events, bool track_blocks) {
    ManagerOptions o;
    o.num_blocks = num_blocks;
    o.eviction_policy = eviction_policy;
    o.store_threshold = store_threshold;
    o.max_tracker_size = max_tracker_size;
    o.enable_events = enable_events;
    o.track_blocks = track_blocks;
    manager_ = Unwrap(OffloadManager::Create(std::move(o)));
  }

  // From the parsed config + geometry (OffloadStack).
  // With `journal_dir`: kvo's durable event journal there (opened or created). A journal that
  // already holds records is a restart: the manager is recovered from it (CPU blocks announced
  // removed, file tiers reconciled with their directories) and keeps appending.
  PyManager(const std::string& config_json, const KvGeometry& kv, const FsRunFields& run,
            uint32_t rank, bool enable_kv_cache_events, std::optional<int64_t> dp_rank,
            py::object cpu_rows, bool track_blocks, const std::optional<std::string>& journal_dir,
            const std::string& journal_fsync) {
    OffloadStackOptions o;
    o.config = Unwrap(ParseOffloadConfig(config_json, kv));
    o.geometry = Unwrap(ComputeOffloadGeometry(o.config, kv));
    if (o.geometry.num_blocks == 0) {
      throw py::value_error("cpu_bytes_to_use: " + std::to_string(o.config.cpu_bytes_to_use) +
                            " bytes hold no CPU block of " + std::to_string(o.geometry.row_bytes) +
                            " bytes");
    }
    o.cpu_rows = cpu_rows.is_none()
                     ? rows_.Reserve(o.geometry.num_blocks, o.geometry.row_bytes)
                     : rows_.Adopt(std::move(cpu_rows), o.geometry.row_bytes, "cpu_rows");
    o.run = run;
    o.rank = rank;
    o.enable_kv_cache_events = enable_kv_cache_events;
    o.manager.data_parallel_rank = dp_rank;
    o.manager.track_blocks = track_blocks;
    geometry_ = o.geometry;
    config_ = o.config;
    if (journal_dir) {
      if (journal_dir->empty()) throw py::value_error("journal_dir: must not be empty");
      JournalOptions jo;
      jo.dir = *journal_dir;
      Result<FsyncPolicy> fsync = ParseFsyncPolicy(journal_fsync);
      if (!fsync.ok()) throw py::value_error("journal_fsync: " + fsync.status().message());
      jo.fsync = *fsync;
      journal_ = Unwrap(Journal::Open(jo));
      o.manager.journal = journal_.get();
      recovered_ = !journal_->empty();
      manager_ = Unwrap(recovered_ ? RecoverOffloadManager(o, *journal_) : BuildOffloadManager(o));
      return;
    }
    manager_ = Unwrap(BuildOffloadManager(o));
  }

  bool recovered() const { return recovered_; }

  // lookup's hot path, in raw CPython calls: an exact bytes key of a valid length and the same
  // request context as the previous call (or None twice). Returns a new reference, or nullptr
  // (no Python error set) when the call needs the full path (conversion, errors, a new context).
  PyObject* LookupFast(PyObject* key, PyObject* ctx) {
    if (!PyBytes_CheckExact(key) || manager_ == nullptr || ctx != last_ctx_.ptr()) return nullptr;
    const Py_ssize_t n = PyBytes_GET_SIZE(key);
    if (n <= static_cast<Py_ssize_t>(kGroupBytes) || n > static_cast<Py_ssize_t>(kMaxKeyBytes)) {
      return nullptr;
    }
    const char* p = PyBytes_AS_STRING(key);
    const auto* g = reinterpret_cast<const unsigned char*>(p + n - kGroupBytes);
    const uint32_t group =
        (uint32_t{g[0]} << 24) | (uint32_t{g[1]} << 16) | (uint32_t{g[2]} << 8) | g[3];
    const OffloadKey k =
        OffloadKey::FromDigest(std::string_view(p, static_cast<size_t>(n) - kGroupBytes), group);
    PyObject* r = g_lookup_values[static_cast<int>(manager_->Lookup(k, ctx_))];
    Py_INCREF(r);
    return r;
  }

  py::object Lookup(py::handle key, py::handle ctx) {
    OffloadKey k = KeyFromObject(key.ptr(), "key");
    ContextFrom(ctx, &ctx_, &last_ctx_);
    return LookupEnum(M().Lookup(k, ctx_));
  }

  py::list LookupMany(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    py::list out(keys_.size());
    for (size_t i = 0; i < keys_.size(); ++i) out[i] = LookupEnum(M().Lookup(keys_[i], ctx_));
    return out;
  }

  py::tuple PrefixLookup(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    OffloadManager::PrefixLookupResult r = M().MaximalPrefixLookup(keys_, ctx_);
    return py::make_tuple(r.hits, r.deferred);
  }

  py::tuple PrefixLookupPacked(const py::buffer& keys, size_t key_len, py::handle ctx) {
    KeysFromPacked(keys, key_len, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    OffloadManager::PrefixLookupResult r = M().MaximalPrefixLookup(keys_, ctx_);
    return py::make_tuple(r.hits, r.deferred);
  }

  py::array_t<int64_t> PrepareLoad(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    return SlotsToArray(Unwrap(M().PrepareLoad(keys_, ctx_)));
  }

  void Touch(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    M().Touch(keys_, ctx_);
  }

  void CompleteLoad(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    Check(M().CompleteLoad(keys_, ctx_));
  }

  // vLLM's prepare_store: a new PrepareStoreOutput, or None ("cannot store"). New reference.
  PyObject* PrepareStore(py::handle keys, py::handle ctx) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    bool ok = Unwrap(M().PrepareStore(keys_, ctx_, &store_out_));
    if (!ok) Py_RETURN_NONE;
    const PrepareStoreOutput& o = store_out_;
    const auto n = static_cast<Py_ssize_t>(o.keys_to_store.size());
    py::object kl = py::reinterpret_steal<py::object>(PyList_New(n));
    if (!kl) throw py::error_already_set();
    // keys_to_store is a subsequence of the keys passed (input order, first occurrences): hand
    // back the caller's own bytes objects where it passed a list or tuple of bytes.
    PyObject* in = keys.ptr();
    Py_ssize_t j = 0;
    if (PyList_Check(in) || PyTuple_Check(in)) {
      PyObject** items = PySequence_Fast_ITEMS(in);
      for (size_t i = 0; i < keys_.size() && j < n; ++i) {
        if (!(keys_[i] == o.keys_to_store[static_cast<size_t>(j)])) continue;
        PyObject* k = items[i];
        if (PyBytes_CheckExact(k)) {
          Py_INCREF(k);
        } else if ((k = KeyToBytesRaw(keys_[i])) == nullptr) {
          throw py::error_already_set();
        }
        PyList_SET_ITEM(kl.ptr(), j++, k);
      }
    }
    for (; j < n; ++j) {
      PyObject* k = KeyToBytesRaw(o.keys_to_store[static_cast<size_t>(j)]);
      if (k == nullptr) throw py::error_already_set();
      PyList_SET_ITEM(kl.ptr(), j, k);
    }
    int64_t* d = nullptr;
    py::object slots = py::reinterpret_steal<py::object>(NewInt64Array(n, &d));
    if (!slots) throw py::error_already_set();
    for (Py_ssize_t i = 0; i < n; ++i) d[i] = o.slots[static_cast<size_t>(i)];
    OffloadKey* ev = nullptr;
    const auto ne = static_cast<Py_ssize_t>(o.evicted_keys.size());
    if (ne > 0) {
      ev = static_cast<OffloadKey*>(PyMem_Malloc(static_cast<size_t>(ne) * sizeof(OffloadKey)));
      if (ev == nullptr) throw std::bad_alloc();
      std::memcpy(static_cast<void*>(ev), o.evicted_keys.data(),
                  static_cast<size_t>(ne) * sizeof(OffloadKey));
    }
    auto* out =
        reinterpret_cast<StoreOutputObject*>(g_store_output_type->tp_alloc(g_store_output_type, 0));
    if (out == nullptr) {
      PyMem_Free(ev);
      throw py::error_already_set();
    }
    out->keys_to_store = kl.release().ptr();
    out->store_slots = slots.release().ptr();
    out->evicted = nullptr;
    out->evicted_keys = ev;
    out->num_evicted = ne;
    return reinterpret_cast<PyObject*>(out);
  }

  void CompleteStore(py::handle keys, py::handle ctx, bool success) {
    KeysFromIterable(keys, "keys", &keys_);
    ContextFrom(ctx, &ctx_, &last_ctx_);
    Check(M().CompleteStore(keys_, ctx_, success));
  }

  // OffloadPolicy as its vLLM value string ("block_level" | "request_level").
  std::string OnNewRequest(py::handle ctx) {
    ContextFrom(ctx, &ctx_, &last_ctx_);
    return M().OnNewRequest(ctx_) == OffloadPolicy::kRequestLevel ? "request_level" : "block_level";
  }
  void OnRequestFinished(py::handle ctx) {
    ContextFrom(ctx, &ctx_, &last_ctx_);
    M().OnRequestFinished(ctx_);
  }
  void OnScheduleEnd() { M().OnScheduleEnd(); }
  bool HasPendingWork() { return M().HasPendingWork(); }
  void ResetCache() { M().ResetCache(); }

  py::list TakeEvents() {
    if (journal_) {
      // A journal write error is logged and counted (get_stats: event_errors); the events still
      // go to the caller (vLLM's connector publishes them).
      M().TakeEventsAndJournal(&events_).IgnoreError();
    } else {
      M().TakeEvents(&events_);
    }
    PyObject* out = EventsToList(events_);
    if (out == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::list>(out);
  }

  py::dict GetStats() { return StatsDict(M().GetStats()); }

  void CheckInvariants() { Check(OffloadManagerPeer::CheckInvariants(M())); }

  py::dict Snapshot() {
    ManagerSnapshot s = Unwrap(M().Snapshot());
    py::dict d;
    d["cpu"] = KeysToList(s.cpu);
    d["storage"] = KeysToList(s.storage);
    return d;
  }

  // Inspection (tests): the ARC policy's lists (keys, LRU first) and target, as vLLM's
  // ARCCachePolicy names them; None for another policy.
  py::object ArcState() {
    auto* arc = dynamic_cast<ArcPolicy*>(&OffloadManagerPeer::CpuPolicy(M()));
    if (arc == nullptr) return py::none();
    py::dict d;
    d["t1"] = KeysToList(arc->Keys(ArcPolicy::List::kT1));
    d["t2"] = KeysToList(arc->Keys(ArcPolicy::List::kT2));
    d["b1"] = KeysToList(arc->Keys(ArcPolicy::List::kB1));
    d["b2"] = KeysToList(arc->Keys(ArcPolicy::List::kB2));
    d["target_t1_size"] = arc->target_t1_size();
    d["cache_capacity"] = arc->capacity();
    return d;
  }

  void ArcSetTarget(double target) {
    auto* arc = dynamic_cast<ArcPolicy*>(&OffloadManagerPeer::CpuPolicy(M()));
    if (arc == nullptr) throw py::value_error("eviction_policy: not arc");
    arc->set_target_t1_size_for_testing(target);
  }

  // The derived geometry (from_config only).
  py::dict Geometry() const {
    py::dict d;
    d["blocks_per_chunk"] = geometry_.blocks_per_chunk;
    d["tokens_per_chunk"] = geometry_.tokens_per_chunk;
    d["hashes_per_chunk"] = geometry_.hashes_per_chunk;
    d["num_copies"] = geometry_.num_copies;
    d["kv_bytes_per_chunk"] = geometry_.kv_bytes_per_chunk;
    d["row_bytes"] = geometry_.row_bytes;
    d["num_blocks"] = geometry_.num_blocks;
    d["offload_prompt_only"] = config_.offload_prompt_only;
    d["self_describing_kv_events"] = config_.self_describing_kv_events;
    py::list warnings;
    for (const std::string& w : config_.warnings) warnings.append(w);
    d["warnings"] = warnings;
    return d;
  }

  // Blocks (GIL released) until every secondary tier's in-flight jobs finished; their results are
  // taken by the next on_schedule_end.
  void DrainTiers() {
    OffloadManager& m = M();
    py::gil_scoped_release release;
    for (size_t i = 0; i < m.num_secondary_tiers(); ++i) m.secondary_tier(i).Drain();
  }

  // Drains the tiers' jobs and frees the manager; every later call raises.
  void Shutdown() {
    if (!manager_) return;
    for (size_t i = 0; i < manager_->num_secondary_tiers(); ++i) {
      manager_->secondary_tier(i).Drain();
    }
    manager_.reset();
    if (journal_) Check(journal_->Sync());
  }

 private:
  OffloadManager& M() {
    if (!manager_) PyErr_SetString(g_contract_error, "the manager was shut down");
    if (!manager_) throw py::error_already_set();
    return *manager_;
  }
  static py::object LookupEnum(LookupResult r);

  Rows rows_;                         // declared before manager_: destroyed after it
  std::unique_ptr<Journal> journal_;  // likewise
  bool recovered_ = false;
  std::unique_ptr<OffloadManager> manager_;
  OffloadGeometry geometry_;
  OffloadConfig config_;
  // Reused per call (no allocation once warm).
  std::vector<OffloadKey> keys_;
  RequestContext ctx_;
  py::object last_ctx_;  // the request context ctx_ was converted from (ContextFrom)
  PrepareStoreOutput store_out_;
  std::vector<OffloadingEvent> events_;
};

py::object PyManager::LookupEnum(LookupResult r) {
  return py::reinterpret_borrow<py::object>(g_lookup_values[static_cast<int>(r)]);
}

// The PyManager of a manager instance, or nullptr when not initialised.
PyManager* SelfOrNull(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  void* v =
      inst->simple_layout ? inst->simple_value_holder[0] : inst->nonsimple.values_and_holders[0];
  return static_cast<PyManager*>(v);
}

PyManager* Self(PyObject* self);

// `lookup` through CPython's vectorcall protocol: the per-key call is the scheduler's hot path and
// pybind11's generic dispatcher costs more than the lookup itself. Positional calls land here;
// calls with keywords go to the pybind11 method kept as `_lookup`.
PyObject* FastLookup(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  // The common call first: lookup(key, ctx) positionally with the previous call's context.
  if (kwnames == nullptr && (nargs == 1 || nargs == 2)) {
    if (PyManager* m = SelfOrNull(self); m != nullptr) {
      PyObject* r = m->LookupFast(args[0], nargs == 2 ? args[1] : Py_None);
      if (r != nullptr) return r;
    }
  }
  try {
    if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) || nargs < 1 || nargs > 2) {
      py::object slow = py::reinterpret_borrow<py::object>(self).attr("_lookup");
      return PyObject_Vectorcall(slow.ptr(), args, static_cast<size_t>(nargs), kwnames);
    }
    py::handle ctx = nargs == 2 ? py::handle(args[1]) : py::none();
    return Self(self)->Lookup(args[0], ctx).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyManager* Self(PyObject* self) {
  PyManager* m = SelfOrNull(self);
  if (m == nullptr) throw py::type_error("OffloadManager: not initialised");
  return m;
}

// Binds a METH_FASTCALL | METH_KEYWORDS call's arguments to `names` (out[i] stays nullptr when
// not given; the first `required` are required). TypeError names the function and argument.
void BindArgs(const char* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
              const char* const* names, int num_names, int required, PyObject** out) {
  for (int i = 0; i < num_names; ++i) out[i] = nullptr;
  if (nargs > num_names) {
    throw py::type_error(std::string(fn) + "() takes at most " + std::to_string(num_names) +
                         " arguments (" + std::to_string(nargs) + " given)");
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  const Py_ssize_t nk = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nk; ++k) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
    if (name == nullptr) throw py::error_already_set();
    int at = -1;
    for (int i = 0; i < num_names; ++i) {
      if (std::strcmp(name, names[i]) == 0) at = i;
    }
    if (at < 0) {
      throw py::type_error(std::string(fn) + "() got an unexpected keyword argument '" +
                           std::string(name).substr(0, 64) + "'");
    }
    if (out[at] != nullptr) {
      throw py::type_error(std::string(fn) + "() got multiple values for argument '" + names[at] +
                           "'");
    }
    out[at] = args[nargs + k];
  }
  for (int i = 0; i < required; ++i) {
    if (out[i] == nullptr) {
      throw py::type_error(std::string(fn) + "() missing required argument '" + names[i] + "'");
    }
  }
}

// Runs `f` (returning a new reference) with C++ exceptions turned into Python ones.
template <class F>
PyObject* Guarded(F&& f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// prepare_store and complete_store through vectorcall, as lookup: once per request per step in
// vLLM's scheduler, and pybind11's dispatcher cost as much as the C++ store path itself.
PyObject* FastPrepareStore(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  return Guarded([&]() -> PyObject* {
    static const char* const kNames[] = {"keys", "req_context"};
    PyObject* a[2];
    BindArgs("prepare_store", args, nargs, kwnames, kNames, 2, 1, a);
    return Self(self)->PrepareStore(a[0], a[1] != nullptr ? a[1] : Py_None);
  });
}

PyObject* FastCompleteStore(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                            PyObject* kwnames) {
  return Guarded([&]() -> PyObject* {
    static const char* const kNames[] = {"keys", "req_context", "success"};
    PyObject* a[3];
    BindArgs("complete_store", args, nargs, kwnames, kNames, 3, 1, a);
    bool success = true;
    if (a[2] != nullptr) {
      const int t = PyObject_IsTrue(a[2]);
      if (t < 0) throw py::error_already_set();
      success = t != 0;
    }
    Self(self)->CompleteStore(a[0], a[1] != nullptr ? a[1] : Py_None, success);
    Py_RETURN_NONE;
  });
}

PyMethodDef g_fast_store_defs[] = {
    {"prepare_store", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(FastPrepareStore)),
     METH_FASTCALL | METH_KEYWORDS,
     "prepare_store(keys, req_context=None) -> PrepareStoreOutput | None: vLLM's prepare_store"},
    {"complete_store",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(FastCompleteStore)),
     METH_FASTCALL | METH_KEYWORDS,
     "complete_store(keys, req_context=None, success=True): vLLM's complete_store"}};

PyMethodDef g_fast_lookup_def = {
    "lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(FastLookup)),
    METH_FASTCALL | METH_KEYWORDS,
    "lookup(key, req_context=None) -> LookupResult: vLLM's lookup of one key"};

}  // namespace
}  // namespace kvo::python

using namespace kvo;          // NOLINT(build/namespaces): the module body only
using namespace kvo::python;  // NOLINT(build/namespaces)

PYBIND11_MODULE(_kvo, m) {
  m.doc() = "kvo's C++ offload manager, file tier and transfer engine (see the kvo package)";
#ifdef KVO_PY_WITH_CUDA
  // "cuda" in the engine registry (its entry points answer Unavailable without a driver).
  kvo::cuda::RegisterCudaTransferEngine().IgnoreError();
#endif

  static py::exception<std::runtime_error> contract(m, "ContractError", PyExc_RuntimeError);
  g_contract_error = contract.ptr();

  py::enum_<LookupResult> lr(m, "LookupResult", "vLLM's LookupResult");
  lr.value("MISS", LookupResult::kMiss)
      .value("HIT", LookupResult::kHit)
      .value("HIT_PENDING", LookupResult::kHitPending)
      .value("RETRY", LookupResult::kRetry);
  for (LookupResult r :
       {LookupResult::kMiss, LookupResult::kHit, LookupResult::kHitPending, LookupResult::kRetry}) {
    g_lookup_values[static_cast<int>(r)] = py::cast(r).release().ptr();
  }

  g_store_output_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_store_output_spec));
  if (g_store_output_type == nullptr) throw py::error_already_set();
  m.attr("PrepareStoreOutput") =
      py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(g_store_output_type));

  g_event_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_event_spec));
  if (g_event_type == nullptr) throw py::error_already_set();
  m.attr("OffloadingEvent") =
      py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(g_event_type));

  py::class_<PyManager> manager_cls(
      m, "OffloadManager",
      "kvo's C++ offload manager with vLLM's OffloadingManager method names and "
      "semantics. Keys are bytes (block hash + 4-byte big-endian group).");
  manager_cls
      .def(py::init<size_t, const std::string&, int64_t, size_t, bool, bool>(),
           py::arg("num_blocks"), py::arg("eviction_policy") = "lru",
           py::arg("store_threshold") = 0, py::arg("max_tracker_size") = 64000,
           py::arg("enable_events") = true, py::arg("track_blocks") = false)
      .def_static(
          "_from_config_json",
          [](const std::string& json, uint64_t worker_kv_bytes_per_block, uint64_t gpu_block_size,
             uint64_t tokens_per_hash, uint64_t world_size, bool replicated_layout,
             bool enable_kv_cache_events, std::optional<int64_t> dp_rank, const py::dict& run,
             py::object cpu_rows, bool track_blocks, std::optional<std::string> journal_dir,
             const std::string& journal_fsync) {
            return std::make_unique<PyManager>(
                json,
                GeometryFrom(worker_kv_bytes_per_block, gpu_block_size, tokens_per_hash, world_size,
                             replicated_layout),
                RunFrom(run), RankFrom(run), enable_kv_cache_events, dp_rank, std::move(cpu_rows),
                track_blocks, journal_dir, journal_fsync);
          },
          py::arg("json"), py::arg("worker_kv_bytes_per_block"), py::arg("gpu_block_size"),
          py::arg("tokens_per_hash"), py::arg("world_size"), py::arg("replicated_layout"),
          py::arg("enable_kv_cache_events"), py::arg("data_parallel_rank"), py::arg("run"),
          py::arg("cpu_rows"), py::arg("track_blocks"), py::arg("journal_dir") = py::none(),
          py::arg("journal_fsync") = "never")
      .def("_lookup", &PyManager::Lookup, py::arg("key"), py::arg("req_context") = py::none())
      .def("lookup_many", &PyManager::LookupMany, py::arg("keys"),
           py::arg("req_context") = py::none())
      .def("lookup_prefix", &PyManager::PrefixLookup, py::arg("keys"),
           py::arg("req_context") = py::none(), "vLLM's maximal prefix lookup: (hits, deferred)")
      .def("lookup_prefix_packed", &PyManager::PrefixLookupPacked, py::arg("keys"),
           py::arg("key_len"), py::arg("req_context") = py::none(),
           "lookup_prefix over one buffer of fixed-length keys")
      .def("prepare_load", &PyManager::PrepareLoad, py::arg("keys"),
           py::arg("req_context") = py::none())
      .def("touch", &PyManager::Touch, py::arg("keys"), py::arg("req_context") = py::none())
      .def("complete_load", &PyManager::CompleteLoad, py::arg("keys"),
           py::arg("req_context") = py::none())
      .def("on_new_request", &PyManager::OnNewRequest, py::arg("req_context"))
      .def("on_request_finished", &PyManager::OnRequestFinished, py::arg("req_context"))
      .def("on_schedule_end", &PyManager::OnScheduleEnd)
      .def("has_pending_work", &PyManager::HasPendingWork)
      .def("reset_cache", &PyManager::ResetCache)
      .def("take_events", &PyManager::TakeEvents)
      .def("get_stats", &PyManager::GetStats)
      .def("check_invariants", &PyManager::CheckInvariants)
      .def("snapshot", &PyManager::Snapshot)
      .def("geometry", &PyManager::Geometry)
      .def("_arc_state", &PyManager::ArcState,
           "tests: the ARC policy's t1/t2/b1/b2 keys (LRU first) and target_t1_size, or None")
      .def("_arc_set_target_t1_size", &PyManager::ArcSetTarget, py::arg("target"),
           "tests: sets the ARC policy's target_t1_size")
      .def("drain_tiers", &PyManager::DrainTiers,
           "blocks until the secondary tiers' in-flight jobs finished (vLLM's drain_jobs)")
      .def_property_readonly("recovered", &PyManager::recovered,
                             "True when built from an existing journal (a restart)")
      .def("shutdown", &PyManager::Shutdown);
  {
    PyObject* descr =
        PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(manager_cls.ptr()), &g_fast_lookup_def);
    if (descr == nullptr) throw py::error_already_set();
    manager_cls.attr("lookup") = py::reinterpret_steal<py::object>(descr);
    for (PyMethodDef& def : g_fast_store_defs) {
      PyObject* d = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(manager_cls.ptr()), &def);
      if (d == nullptr) throw py::error_already_set();
      manager_cls.attr(def.ml_name) = py::reinterpret_steal<py::object>(d);
    }
  }
  BindFsTierAndEngine(m);

  m.def(
      "read_journal",
      [](const std::string& dir) {
        // [(seq, ts, [(kind, [hash], medium, reason)])]: hashes as ints (u64 wire form) or bytes.
        JournalOptions jo;
        jo.dir = dir;
        jo.read_only = true;
        std::unique_ptr<Journal> j = Unwrap(Journal::Open(jo));
        py::list out;
        if (j->empty()) return out;
        std::unique_ptr<JournalReader> r = Unwrap(j->NewReader(0));
        JournalRecord rec;
        while (Unwrap(r->Next(&rec))) {
          EventBatch b = Unwrap(DecodeBatch(rec.payload));
          py::list evs;
          auto hashes = [](const std::vector<BlockHash>& hs) {
            py::list l;
            for (const BlockHash& h : hs) {
              l.append(h.is_bytes() ? py::object(py::bytes(h.bytes))
                                    : py::object(py::int_(h.Low64())));
            }
            return l;
          };
          for (const KvEvent& e : b.events) {
            if (const auto* st = std::get_if<BlockStored>(&e)) {
              evs.append(
                  py::make_tuple("BlockStored", hashes(st->block_hashes), st->medium, py::none()));
            } else if (const auto* rm = std::get_if<BlockRemoved>(&e)) {
              evs.append(
                  py::make_tuple("BlockRemoved", hashes(rm->block_hashes), rm->medium, rm->reason));
            } else {
              evs.append(py::make_tuple("AllBlocksCleared", py::list(), py::none(), py::none()));
            }
          }
          out.append(py::make_tuple(rec.seq, b.ts, evs));
        }
        return out;
      },
      py::arg("dir"), "kvo's event journal in `dir`, decoded (checksums verified)");
  m.def("fs_tier_config_keys", &FsTierConfigKeys);
  m.def("offload_config_keys", &OffloadConfigKeys);
  m.def("transfer_engines", &RegisteredTransferEngines);
  m.def(
      "row_bytes_for",
      [](const std::string& json, uint64_t worker_kv_bytes_per_block, uint64_t gpu_block_size,
         uint64_t tokens_per_hash, uint64_t world_size, bool replicated_layout) {
        KvGeometry kv = GeometryFrom(worker_kv_bytes_per_block, gpu_block_size, tokens_per_hash,
                                     world_size, replicated_layout);
        OffloadConfig c = Unwrap(ParseOffloadConfig(json, kv));
        OffloadGeometry g = Unwrap(ComputeOffloadGeometry(c, kv));
        return py::make_tuple(g.num_blocks, g.row_bytes, g.blocks_per_chunk);
      },
      "(num_blocks, row_bytes, blocks_per_chunk) the config and geometry give");
}
