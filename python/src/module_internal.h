// Internal to python/src/: what the module's two files share (kvo_module.cc: the manager, events
// and the module; tier_bindings.cc: the file tier and the transfer engine): Status to Python
// exceptions, keys, request contexts, the CPU rows. The binding-edge rules are in kvo_module.cc.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <structmember.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/status.h"
#include "events/codec.h"
#include "events/journal.h"
#include "manager/arc_policy.h"
#include "manager/config.h"
#include "manager/offload_manager.h"
#include "manager/offload_stack.h"
#include "manager/secondary_tier.h"
#include "transfer/fs_namespace.h"
#include "transfer/kv_layout.h"
#include "transfer/transfer_engine.h"
#ifdef KVO_PY_WITH_CUDA  // set by python/CMakeLists.txt when transfer/cuda is built
#include "transfer/cuda/cuda_engine.h"
#endif

namespace py = pybind11;

namespace kvo::python {

// ---- errors --------------------------------------------------------------------------------

inline PyObject* g_contract_error = nullptr;  // kvo.ContractError (a RuntimeError)

[[noreturn]] inline void Throw(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      throw py::value_error(s.message());
    case StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, s.message().c_str());
      throw py::error_already_set();
    case StatusCode::kIOError:
    case StatusCode::kOutOfSpace:
    case StatusCode::kCorruption:
      PyErr_SetString(PyExc_OSError, s.message().c_str());
      throw py::error_already_set();
    case StatusCode::kFailedPrecondition:
      PyErr_SetString(g_contract_error, s.message().c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(std::string(StatusCodeName(s.code())) + ": " + s.message());
  }
}

inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
inline T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

inline std::string TypeName(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// ---- keys ----------------------------------------------------------------------------------

inline constexpr size_t kGroupBytes = 4;
inline constexpr size_t kMaxKeyBytes = OffloadKey::kMaxHashBytes + kGroupBytes;

inline OffloadKey KeyFromBytes(const char* p, size_t n, const char* arg) {
  if (n <= kGroupBytes || n > kMaxKeyBytes) {
    throw py::value_error(std::string(arg) +
                          ": an OffloadKey is a 1..32-byte block hash + a 4-byte group (5..36 "
                          "bytes), got " +
                          std::to_string(n) + " bytes");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(p + n - kGroupBytes);
  uint32_t group = (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
  return OffloadKey::FromDigest(std::string_view(p, n - kGroupBytes), group);
}

inline OffloadKey KeyFromObject(PyObject* o, const char* arg) {
  if (PyBytes_Check(o)) return KeyFromBytes(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o), arg);
  if (PyByteArray_Check(o)) {
    return KeyFromBytes(PyByteArray_AS_STRING(o), PyByteArray_GET_SIZE(o), arg);
  }
  throw py::type_error(std::string(arg) + ": an OffloadKey must be bytes, got " +
                       Py_TYPE(o)->tp_name);
}

inline py::bytes KeyToBytes(const OffloadKey& k) {
  char buf[kMaxKeyBytes];
  std::string_view d = k.digest();
  std::memcpy(buf, d.data(), d.size());
  uint32_t g = k.group();
  buf[d.size()] = static_cast<char>(g >> 24);
  buf[d.size() + 1] = static_cast<char>(g >> 16);
  buf[d.size() + 2] = static_cast<char>(g >> 8);
  buf[d.size() + 3] = static_cast<char>(g);
  return py::bytes(buf, d.size() + kGroupBytes);
}

inline PyObject* KeyToBytesRaw(const OffloadKey& k) {
  char buf[kMaxKeyBytes];
  std::string_view d = k.digest();
  std::memcpy(buf, d.data(), d.size());
  uint32_t g = k.group();
  buf[d.size()] = static_cast<char>(g >> 24);
  buf[d.size() + 1] = static_cast<char>(g >> 16);
  buf[d.size() + 2] = static_cast<char>(g >> 8);
  buf[d.size() + 3] = static_cast<char>(g);
  return PyBytes_FromStringAndSize(buf, static_cast<Py_ssize_t>(d.size() + kGroupBytes));
}

inline py::list KeysToList(const std::vector<OffloadKey>& keys) {
  py::list out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = KeyToBytes(keys[i]);
  return out;
}

// Any iterable of bytes keys into *out (cleared first). Lists and tuples take the fast path.
inline void KeysFromIterable(py::handle obj, const char* arg, std::vector<OffloadKey>* out) {
  out->clear();
  PyObject* o = obj.ptr();
  if (PyBytes_Check(o) || PyByteArray_Check(o) || PyUnicode_Check(o)) {
    throw py::type_error(std::string(arg) + ": expected a collection of bytes keys, got one " +
                         Py_TYPE(o)->tp_name);
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    out->reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out->push_back(KeyFromObject(items[i], arg));
    return;
  }
  py::iterator it;
  try {
    it = py::iter(obj);
  } catch (py::error_already_set&) {
    throw py::type_error(std::string(arg) + ": expected a collection of bytes keys, got " +
                         TypeName(obj));
  }
  for (py::handle item : it) out->push_back(KeyFromObject(item.ptr(), arg));
}

// Packed keys: one buffer of n keys of `key_len` bytes each (the batch fast path).
inline void KeysFromPacked(const py::buffer& buf, size_t key_len, const char* arg,
                           std::vector<OffloadKey>* out) {
  py::buffer_info info = buf.request();
  if (info.ndim != 1 && !(info.ndim == 2 && static_cast<size_t>(info.shape[1]) == key_len)) {
    throw py::value_error(std::string(arg) + ": a packed key buffer is 1-D bytes");
  }
  size_t total = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
  if (key_len <= kGroupBytes || key_len > kMaxKeyBytes || total % key_len != 0) {
    throw py::value_error(std::string(arg) + ": " + std::to_string(total) +
                          " bytes is not a whole number of " + std::to_string(key_len) +
                          "-byte keys (5..36)");
  }
  out->clear();
  out->reserve(total / key_len);
  const char* p = static_cast<const char*>(info.ptr);
  for (size_t off = 0; off < total; off += key_len)
    out->push_back(KeyFromBytes(p + off, key_len, arg));
}

// A new 1-D numpy int64 array (a new reference; nullptr with a Python error set). Straight through
// numpy's C API: pybind11's array_t constructor allocates its shape and stride vectors per call.
inline PyObject* NewInt64Array(Py_ssize_t n, int64_t** data) {
  auto& api = py::detail::npy_api::get();
  PyObject* descr = api.PyArray_DescrFromType_(py::detail::npy_api::NPY_INT64_);
  if (descr == nullptr) return nullptr;
  Py_intptr_t dims[1] = {n};
  PyObject* a = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, 1, dims, nullptr, nullptr, 0,
                                          nullptr);  // steals descr
  if (a != nullptr) *data = reinterpret_cast<int64_t*>(py::detail::array_proxy(a)->data);
  return a;
}

inline py::array_t<int64_t> SlotsToArray(const std::vector<int32_t>& slots) {
  int64_t* d = nullptr;
  PyObject* a = NewInt64Array(static_cast<Py_ssize_t>(slots.size()), &d);
  if (a == nullptr) throw py::error_already_set();
  for (size_t i = 0; i < slots.size(); ++i) d[i] = slots[i];
  return py::reinterpret_steal<py::array_t<int64_t>>(a);
}

// ---- request context -----------------------------------------------------------------------

// vLLM's ReqContext (anything with .req_id), a str request id, or None, into *ctx. The scheduler
// passes one ReqContext object for all of a request's calls: `last` keeps the object converted
// last (a strong reference, so its identity cannot be reused) and the conversion is skipped when
// the same object comes again (vLLM never changes a ReqContext's req_id).
inline void ContextFrom(py::handle obj, RequestContext* ctx, py::object* last) {
  if (last != nullptr && last->ptr() == obj.ptr() && obj.ptr() != nullptr) return;
  ctx->load_tier_filter.reset();
  if (obj.is_none()) {
    ctx->req_id.clear();
  } else if (PyUnicode_Check(obj.ptr())) {
    ctx->req_id = obj.cast<std::string>();
  } else {
    PyObject* id = PyObject_GetAttrString(obj.ptr(), "req_id");
    if (id == nullptr) {
      PyErr_Clear();
      throw py::type_error(
          "req_context: expected a ReqContext (with .req_id), a str or None, got " + TypeName(obj));
    }
    py::object idh = py::reinterpret_steal<py::object>(id);
    if (!PyUnicode_Check(id)) {
      throw py::type_error("req_context.req_id: expected str, got " + TypeName(idh));
    }
    ctx->req_id = idh.cast<std::string>();
  }
  if (last != nullptr) *last = py::reinterpret_borrow<py::object>(obj);
}

inline void ContextFrom(py::handle obj, RequestContext* ctx) { ContextFrom(obj, ctx, nullptr); }

// ---- host memory for the CPU rows ----------------------------------------------------------

// The CPU rows a manager's file tiers read and write: a caller's writable buffer (kept alive), or
// an anonymous mapping reserved lazily (no memory is touched until a tier copies into it).
class Rows {
 public:
  Rows() = default;
  Rows(const Rows&) = delete;
  Rows& operator=(const Rows&) = delete;
  ~Rows() {
    if (mapped_ != nullptr) munmap(mapped_, mapped_len_);
  }

  HostRegion Adopt(py::object owner, uint64_t row_bytes, const char* arg) {
    py::buffer buf = py::reinterpret_borrow<py::buffer>(owner);
    py::buffer_info info = buf.request(/*writable=*/true);
    if (!IsContiguous(info)) throw py::value_error(std::string(arg) + ": must be C-contiguous");
    uint64_t bytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
    owner_ = std::move(owner);
    return HostRegion{reinterpret_cast<uintptr_t>(info.ptr), row_bytes ? bytes / row_bytes : 0,
                      row_bytes};
  }

  HostRegion Reserve(uint64_t num_slots, uint64_t row_bytes) {
    uint64_t len = num_slots * row_bytes;
    if (len == 0) return HostRegion{0, 0, row_bytes};
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cannot reserve the CPU rows");
    mapped_ = p;
    mapped_len_ = len;
    return HostRegion{reinterpret_cast<uintptr_t>(p), num_slots, row_bytes};
  }

  static bool IsContiguous(const py::buffer_info& info) {
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
      if (info.shape[i] > 1 && info.strides[i] != expect) return false;
      expect *= info.shape[i];
    }
    return true;
  }

 private:
  py::object owner_;
  void* mapped_ = nullptr;
  size_t mapped_len_ = 0;
};

// kvo.LookupResult members by LookupResult; owned references kept for the process's life (a
// static py::object would be released after the interpreter is gone).
inline PyObject* g_lookup_values[4] = {};

inline KvGeometry GeometryFrom(uint64_t worker_kv_bytes_per_block, uint64_t gpu_block_size,
                               uint64_t tokens_per_hash, uint64_t world_size,
                               bool replicated_layout) {
  KvGeometry g;
  g.worker_kv_bytes_per_block = worker_kv_bytes_per_block;
  g.gpu_block_size = gpu_block_size;
  g.tokens_per_hash = tokens_per_hash;
  g.world_size = world_size;
  g.replicated_layout = replicated_layout;
  return g;
}

inline FsRunFields RunFrom(const py::dict& run) {
  FsRunFields f;
  auto get = [&](const char* k) -> py::object {
    return run.contains(k) ? py::reinterpret_borrow<py::object>(run[k]) : py::none();
  };
  if (!get("model_name").is_none()) f.model_name = get("model_name").cast<std::string>();
  if (!get("dtype").is_none()) f.dtype = get("dtype").cast<std::string>();
  if (!get("tokens_per_hash").is_none())
    f.tokens_per_hash = get("tokens_per_hash").cast<uint32_t>();
  if (!get("tp_size").is_none()) f.tp_size = get("tp_size").cast<uint32_t>();
  if (!get("pp_size").is_none()) f.pp_size = get("pp_size").cast<uint32_t>();
  if (!get("pcp_size").is_none()) f.pcp_size = get("pcp_size").cast<uint32_t>();
  if (!get("dcp_size").is_none()) f.dcp_size = get("dcp_size").cast<uint32_t>();
  if (!get("parallel_agnostic").is_none())
    f.parallel_agnostic = get("parallel_agnostic").cast<bool>();
  if (!get("replicated_layout").is_none())
    f.replicated_layout = get("replicated_layout").cast<bool>();
  if (!get("canonical_format_json").is_none()) {
    f.canonical_format_json = get("canonical_format_json").cast<std::string>();
  }
  if (!get("groups").is_none()) {
    for (py::handle g : get("groups")) {
      py::tuple t = py::reinterpret_borrow<py::object>(g).cast<py::tuple>();
      FsRunFields::Group grp;
      grp.tokens_per_block = t[0].cast<uint32_t>();
      grp.layer_names = t[1].cast<std::vector<std::string>>();
      f.kv_cache_groups.push_back(std::move(grp));
    }
  }
  return f;
}

// The rank in a run dict (vLLM's parallel.rank; 0 when absent): the file tiers' <ns>_r<rank>.
inline uint32_t RankFrom(const py::dict& run) {
  if (!run.contains("rank")) return 0;
  py::handle r = run["rank"];
  if (r.is_none()) return 0;
  if (!PyLong_Check(r.ptr()) || PyBool_Check(r.ptr())) {
    throw py::type_error("rank: expected an int, got " + TypeName(r));
  }
  const long long v = PyLong_AsLongLong(r.ptr());
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error("rank: out of range [0, 2147483647]");
  }
  if (v < 0 || v > 2147483647LL) {
    throw py::value_error("rank: " + std::to_string(v) + " is out of range [0, 2147483647]");
  }
  return static_cast<uint32_t>(v);
}

// Binds kvo.FsTier and kvo.TransferEngine (tier_bindings.cc).
void BindFsTierAndEngine(py::module_& m);

}  // namespace kvo::python
