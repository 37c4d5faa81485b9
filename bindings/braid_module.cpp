// braid._C — the private pybind11 extension behind the `braid` Python package.
//
// Thin on purpose: every function maps one-to-one onto the C++ API (include/braid).
// Buffers arrive as raw addresses (int) plus element count and dtype; the pure-Python
// layer (python/braid) extracts them from NumPy arrays and torch tensors, checks
// dtype, contiguity and sizes, and keeps the buffers alive until the Work completes.
//
// Rules kept here:
// - Every call that can block (set-up, posting, wait, store operations, close)
//   releases the GIL, as c10d's init.cpp does.
// - braid::Error becomes a Python exception of the class matching its ErrorCode
//   (braid.Error and subclasses, created below), with the same message and the
//   attributes `code` (the ErrorCode name) and `peer` (the blamed rank or -1).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <braid/braid.hpp>
#include <braid/device.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace std::chrono;

namespace {

/// True once the interpreter is shutting down: a braid thread must not take the GIL then.
bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}


// Exception classes by ErrorCode (index = code value); [0] is braid.Error itself.
PyObject* g_error_classes[16] = {};

PyObject* error_class(braid::ErrorCode code) {
  const int i = static_cast<int>(code);
  if (i > 0 && i < 16 && g_error_classes[i]) return g_error_classes[i];
  return g_error_classes[0];
}

// A new Python exception instance for a braid error (a new reference, or null with
// a Python error set).
PyObject* make_exception(const braid::Error& e) {
  PyObject* cls = error_class(e.code());
  PyObject* inst = PyObject_CallFunction(cls, "s", e.what());
  if (!inst) return nullptr;
  const std::string code(braid::to_string(e.code()));
  int peer = -1;
  if (auto* r = dynamic_cast<const braid::RemoteError*>(&e)) peer = r->peer();
  PyObject* code_obj = PyUnicode_FromString(code.c_str());
  PyObject* peer_obj = PyLong_FromLong(peer);
  if (code_obj) PyObject_SetAttrString(inst, "code", code_obj);
  if (peer_obj) PyObject_SetAttrString(inst, "peer", peer_obj);
  Py_XDECREF(code_obj);
  Py_XDECREF(peer_obj);
  return inst;
}

void raise(const braid::Error& e) {
  PyObject* inst = make_exception(e);
  if (!inst) return;  // a Python error is already set
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(inst)), inst);
  Py_DECREF(inst);
}

// Creates `braid.<name>` deriving from `bases` and stores it in the module.
PyObject* new_error_class(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qual = std::string("braid.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // the module holds a reference
  return cls;
}

milliseconds ms(std::optional<double> seconds) {
  if (!seconds) return milliseconds(0);
  return milliseconds(static_cast<std::int64_t>(*seconds * 1000.0 + 0.5));
}

const void* cptr(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }
void* mptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

braid::CommOptions comm_options(std::optional<double> timeout, const std::string& name, std::size_t chunk_bytes,
                                const std::string& host_id, const std::string& transport, int device) {
  braid::CommOptions o;
  o.timeout = ms(timeout);
  o.name = name;
  o.chunk_bytes = chunk_bytes;
  o.host_id = host_id;
  o.transport = transport;
  o.device = device;
  return o;
}

// Lets Python classes (for instance an adapter over a torch.distributed store) serve
// as a braid::Store. Calls may come from the communicator's progress thread, so each
// takes the GIL, and a Python exception becomes a braid::Error (the engine speaks
// nothing else): Timeout for get/wait, Network for the rest.
class PyStore : public braid::Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    call("set", braid::ErrorCode::Network, [&](py::function& f) { f(key, py::bytes(value)); });
  }
  std::string get(const std::string& key, milliseconds timeout) override {
    std::string v;
    call("get", braid::ErrorCode::Timeout,
         [&](py::function& f) { v = f(key, timeout.count() / 1000.0).cast<std::string>(); });
    return v;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t v = 0;
    call("add", braid::ErrorCode::Network, [&](py::function& f) { v = f(key, delta).cast<std::int64_t>(); });
    return v;
  }
  bool check(const std::vector<std::string>& keys) override {
    bool v = false;
    call("check", braid::ErrorCode::Network, [&](py::function& f) { v = f(keys).cast<bool>(); });
    return v;
  }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    call("wait", braid::ErrorCode::Timeout, [&](py::function& f) { f(keys, timeout.count() / 1000.0); });
  }
  bool remove(const std::string& key) override {
    bool v = false;
    call("remove", braid::ErrorCode::Network, [&](py::function& f) { v = f(key).cast<bool>(); });
    return v;
  }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    bool has = false;
    if (!interpreter_finalizing()) {
      py::gil_scoped_acquire gil;
      has = static_cast<bool>(py::get_override(static_cast<const braid::Store*>(this), "compare_set"));
    }
    if (!has) return braid::Store::compare_set(key, expected, desired);  // Unsupported, naming the key
    std::string v;
    call("compare_set", braid::ErrorCode::Network, [&](py::function& f) {
      v = f(key, py::bytes(expected), py::bytes(desired)).cast<std::string>();
    });
    return v;
  }

 private:
  template <class F>
  void call(const char* name, braid::ErrorCode code, F&& body) {
    std::string failure;
    // A braid thread (the progress engine) must not take the GIL once the interpreter
    // is finalizing: CPython ends such a thread with pthread_exit, whose forced unwind
    // would abort the process ("terminate called without an active exception").
    if (interpreter_finalizing())
      throw braid::Error(braid::ErrorCode::Aborted,
                         std::string("Python store ") + name + "(): the Python interpreter is shutting down");
    {
      py::gil_scoped_acquire gil;
      py::function f = py::get_override(static_cast<const braid::Store*>(this), name);
      if (!f) throw braid::Error(braid::ErrorCode::InvalidUsage, std::string("Python store lacks ") + name + "()");
      try {
        body(f);
        return;
      } catch (py::error_already_set& e) {
        failure = e.what();
      } catch (const py::cast_error& e) {
        failure = e.what();
      }
    }
    const std::string msg = std::string("Python store ") + name + "() failed: " + failure;
    if (code == braid::ErrorCode::Timeout) throw braid::TimeoutError(msg);
    throw braid::Error(code, msg);
  }
};

}  // namespace

namespace {

/// The Python object for a Work's failure (None on success). Needs the GIL.
py::object exception_object(const std::exception_ptr& p) {
  if (!p) return py::none();
  try {
    std::rethrow_exception(p);
  } catch (const braid::Error& e) {
    PyObject* inst = make_exception(e);
    if (!inst) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(inst);
  } catch (const std::exception& e) {
    return py::module_::import("builtins").attr("RuntimeError")(e.what());
  }
}

/// Work.on_complete: the Python callable is called with the GIL on whichever thread
/// completes the work, and released with the GIL too; once the interpreter finalizes
/// neither happens (a braid thread taking the GIL then is ended with pthread_exit).
void on_complete(const braid::Work& w, py::function fn) {
  auto* held = new py::function(std::move(fn));
  std::shared_ptr<py::function> f(held, [](py::function* p) {
    if (interpreter_finalizing()) return;  // leaked on purpose: no GIL to drop it with
    py::gil_scoped_acquire gil;
    delete p;
  });
  py::gil_scoped_release nogil;  // the callback may run here, at once, and take it back
  w.on_complete([f](std::exception_ptr error) {
    if (interpreter_finalizing()) return;
    py::gil_scoped_acquire gil;
    try {
      (*f)(exception_object(error));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("braid Work.on_complete callback");
    }
  });
}

/// Completion of sets of Works for Python threads (the torch backend's futures). watch()
/// registers Work::on_complete callbacks that only queue, so braid's progress thread never
/// takes the GIL; next() hands the finished sets, in the order they finished, to whichever
/// Python thread asks. Python callbacks that wait for other collectives (torch's PowerSGD
/// hook does) thus run on Python's threads, never on braid's.
class CompletionQueue {
 public:
  CompletionQueue() : s_(std::make_shared<Shared>()) {}
  ~CompletionQueue() { close(); }
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  /// Reports (token, error) once every Work of `works` has completed; error is the failure
  /// of the first failed Work in list order, or None. An empty list is reported at once.
  void watch(const std::vector<braid::Work>& works, py::object token) {
    auto set = std::shared_ptr<Set>(new Set, [](Set* p) {
      // Dropped on a Python thread (GIL held: re-entrant) or, after close, wherever the
      // last callback runs; once the interpreter finalizes the token is leaked on purpose.
      if (p->token && !interpreter_finalizing()) {
        py::gil_scoped_acquire gil;
        Py_DECREF(p->token);
      }
      delete p;
    });
    set->token = token.release().ptr();
    set->errors.resize(works.size());
    set->left = works.size();
    if (works.empty()) {
      push(s_, set);
      return;
    }
    for (std::size_t i = 0; i < works.size(); ++i) {
      works[i].on_complete([s = s_, set, i](std::exception_ptr error) {
        bool last = false;
        {
          std::lock_guard<std::mutex> lock(s->mu);
          set->errors[i] = error;
          last = --set->left == 0;
        }
        if (last) push(s, set);
      });
    }
  }

  /// The next finished set as (token, error); None after `timeout` seconds (forever when
  /// None) or once the queue is closed and drained. Waits without the GIL.
  py::object next(std::optional<double> timeout) {
    std::shared_ptr<Set> set;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(s_->mu);
      auto ready = [&] { return !s_->done.empty() || s_->closed; };
      if (!timeout) {
        s_->cv.wait(lock, ready);
      } else if (!s_->cv.wait_for(lock, std::chrono::duration<double>(std::max(0.0, *timeout)), ready)) {
        return py::none();  // (no Python object was touched without the GIL)
      }
      if (s_->done.empty()) return py::none();  // closed
      set = std::move(s_->done.front());
      s_->done.pop_front();
    }
    std::exception_ptr error;
    for (const auto& e : set->errors)
      if (e && !error) error = e;
    py::object token = py::reinterpret_borrow<py::object>(set->token);
    return py::make_tuple(token, exception_object(error));
  }

  /// Wakes every next() caller; they return what is already queued, then None.
  void close() {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->closed = true;
    }
    s_->cv.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->closed;
  }

  std::size_t ready() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->done.size();
  }

 private:
  struct Set {
    PyObject* token = nullptr;
    std::vector<std::exception_ptr> errors;
    std::size_t left = 0;
  };
  struct Shared {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Set>> done;
    bool closed = false;
  };
  static void push(const std::shared_ptr<Shared>& s, std::shared_ptr<Set> set) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->done.push_back(std::move(set));
    }
    s->cv.notify_one();
  }

  std::shared_ptr<Shared> s_;
};

}  // namespace

/// Communicator.send (kSend) and .recv: the same arguments; recv writes the buffer.
template <bool kSend>
braid::Work p2p(braid::Communicator& c, std::uintptr_t buf, std::size_t count, braid::DataType dtype, int peer,
                std::uint32_t tag, std::optional<double> timeout, std::uintptr_t stream) {
  braid::P2POptions o;
  o.timeout = ms(timeout);
  o.stream = reinterpret_cast<void*>(stream);
  o.tag = tag;
  py::gil_scoped_release nogil;
  return kSend ? c.send(cptr(buf), count, dtype, peer, o) : c.recv(mptr(buf), count, dtype, peer, o);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "Private extension of the braid package; use `import braid` instead.";

  // --- errors ---------------------------------------------------------------------
  py::module_ builtins = py::module_::import("builtins");
  PyObject* base = new_error_class(m, "Error", "Any braid failure; `code` names the ErrorCode, `peer` the blamed rank.",
                                   py::make_tuple(builtins.attr("RuntimeError")));
  py::handle b(base);
  g_error_classes[0] = base;
  using EC = braid::ErrorCode;
  g_error_classes[static_cast<int>(EC::InvalidUsage)] =
      new_error_class(m, "InvalidUsageError", "Bad arguments; nothing was sent.",
                      py::make_tuple(b, builtins.attr("ValueError")));
  g_error_classes[static_cast<int>(EC::Unsupported)] =
      new_error_class(m, "UnsupportedError", "A valid request this build does not implement.",
                      py::make_tuple(b, builtins.attr("NotImplementedError")));
  g_error_classes[static_cast<int>(EC::Timeout)] =
      new_error_class(m, "TimeoutError", "A deadline passed.", py::make_tuple(b, builtins.attr("TimeoutError")));
  g_error_classes[static_cast<int>(EC::Aborted)] =
      new_error_class(m, "AbortedError", "The communicator was aborted or failed earlier.", py::make_tuple(b));
  g_error_classes[static_cast<int>(EC::RemoteError)] =
      new_error_class(m, "RemoteError", "A peer failed, died or closed its connection; `peer` names it.",
                      py::make_tuple(b));
  g_error_classes[static_cast<int>(EC::Network)] =
      new_error_class(m, "NetworkError", "Connection refused, unreachable or bad wire data.",
                      py::make_tuple(b, builtins.attr("ConnectionError")));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const braid::Error& e) {
      raise(e);
    }
  });

  // --- enums ----------------------------------------------------------------------
  py::enum_<braid::DataType>(m, "DataType")
      .value("f32", braid::DataType::f32)
      .value("f64", braid::DataType::f64)
      .value("f16", braid::DataType::f16)
      .value("bf16", braid::DataType::bf16)
      .value("i8", braid::DataType::i8)
      .value("u8", braid::DataType::u8)
      .value("i32", braid::DataType::i32)
      .value("i64", braid::DataType::i64)
      .value("f8e4m3", braid::DataType::f8e4m3)
      .value("f8e5m2", braid::DataType::f8e5m2);
  py::enum_<braid::ReduceOp>(m, "ReduceOp")
      .value("sum", braid::ReduceOp::sum)
      .value("prod", braid::ReduceOp::prod)
      .value("min", braid::ReduceOp::min)
      .value("max", braid::ReduceOp::max)
      .value("avg", braid::ReduceOp::avg)
      .value("premul_sum", braid::ReduceOp::premul_sum);
  py::enum_<braid::Algorithm>(m, "Algorithm")
      .value("auto", braid::Algorithm::automatic)
      .value("ring", braid::Algorithm::ring)
      .value("tree", braid::Algorithm::tree)
      .value("rhd", braid::Algorithm::rhd)
      .value("hierarchical", braid::Algorithm::hierarchical);
  static_assert(braid::kNumAlgorithms == 5, "bind the new Algorithm value above and add it to python/braid/_C.pyi");
  m.def("parse_algorithm", [](const std::string& s) { return braid::parse_algorithm(s); }, py::arg("name"));
  m.def("dtype_size", [](braid::DataType t) { return braid::dtype_size(t); }, py::arg("t"));
  m.def("launch_environment", [] {
    const braid::LaunchEnvironment e = braid::launch_environment();
    py::dict d;
    d["launcher"] = e.launcher;
    d["rank"] = e.rank;
    d["world_size"] = e.world_size;
    d["local_rank"] = e.local_rank;
    d["local_size"] = e.local_size;
    d["master_addr"] = e.master_addr;
    d["master_port"] = e.master_port;
    d["auth_token"] = e.auth_token;
    d["store_external"] = e.store_external;
    d["torch_agent_store"] = e.torch_agent_store;
    return d;
  });
  // --- DLPack (dlpack.h's ABI, v0.x "dltensor" and v1 "dltensor_versioned" capsules) ---
  m.def(
      "dlpack_view",
      [](py::capsule cap) {
        // The structs as dlpack.h lays them out (its ABI is stable; braid does not ship the header).
        struct DLDevice {
          std::int32_t device_type;
          std::int32_t device_id;
        };
        struct DLDataType {
          std::uint8_t code;
          std::uint8_t bits;
          std::uint16_t lanes;
        };
        struct DLTensor {
          void* data;
          DLDevice device;
          std::int32_t ndim;
          DLDataType dtype;
          std::int64_t* shape;
          std::int64_t* strides;
          std::uint64_t byte_offset;
        };
        struct DLManagedTensor {
          DLTensor dl_tensor;
          void* manager_ctx;
          void (*deleter)(DLManagedTensor*);
        };
        struct DLManagedTensorVersioned {
          std::uint32_t major, minor;
          void* manager_ctx;
          void (*deleter)(DLManagedTensorVersioned*);
          std::uint64_t flags;  // bit 0: read-only
          DLTensor dl_tensor;
        };
        const DLTensor* t = nullptr;
        bool read_only = false;
        PyObject* o = cap.ptr();
        if (PyCapsule_IsValid(o, "dltensor_versioned")) {
          auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(o, "dltensor_versioned"));
          if (m->major != 1)
            throw py::value_error("DLPack capsule of version " + std::to_string(m->major) + "." + std::to_string(m->minor) +
                                  "; braid reads version 1");
          t = &m->dl_tensor;
          read_only = (m->flags & 1u) != 0;
        } else if (PyCapsule_IsValid(o, "dltensor")) {
          t = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, "dltensor"))->dl_tensor;
        } else {
          throw py::value_error("not a DLPack capsule (its name is neither 'dltensor' nor 'dltensor_versioned', or it "
                                "was consumed already)");
        }
        py::tuple shape(static_cast<std::size_t>(std::max(t->ndim, 0)));
        py::object strides = py::none();
        for (int k = 0; k < t->ndim; ++k) shape[static_cast<std::size_t>(k)] = t->shape[k];
        if (t->strides != nullptr) {
          py::tuple st(static_cast<std::size_t>(t->ndim));
          for (int k = 0; k < t->ndim; ++k) st[static_cast<std::size_t>(k)] = t->strides[k];
          strides = st;
        }
        py::dict d;
        d["ptr"] = reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset;
        d["device_type"] = t->device.device_type;
        d["device_id"] = t->device.device_id;
        d["shape"] = shape;
        d["strides"] = strides;  // in elements; None: C-contiguous
        d["code"] = t->dtype.code;
        d["bits"] = t->dtype.bits;
        d["lanes"] = t->dtype.lanes;
        d["read_only"] = read_only;
        return d;
      },
      py::arg("capsule"),
      "The tensor a DLPack capsule describes (address with byte_offset applied, device, shape, strides, dtype), "
      "without consuming it.");
  // --- device memory through braid's device runtime (braid/device.hpp) ----------------
  m.def("device_runtime", &braid::device::runtime,
        "The device runtime of this process: 'cuda: ...', 'emulated (tests only): ...' or 'none: <why>'.");
  m.def("device_count", &braid::device::count, "Devices of the device runtime (0: none).");
  m.def(
      "device_alloc",
      [](std::size_t bytes, int device) { return reinterpret_cast<std::uintptr_t>(braid::device::alloc(bytes, device)); },
      py::arg("bytes"), py::arg("device") = -1, "Device memory (an address); free it with device_free.");
  m.def(
      "device_free", [](std::uintptr_t p) { braid::device::free(reinterpret_cast<void*>(p)); }, py::arg("ptr"));
  m.def(
      "device_copy",
      [](std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
        py::gil_scoped_release nogil;
        braid::device::copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), "Synchronous copy, any direction.");
  m.def(
      "device_create_stream", [] { return reinterpret_cast<std::uintptr_t>(braid::device::create_stream()); },
      "A new stream (an address; cudaStream_t under CUDA).");
  m.def(
      "device_destroy_stream", [](std::uintptr_t s) { braid::device::destroy_stream(reinterpret_cast<void*>(s)); },
      py::arg("stream"));
  m.def(
      "device_synchronize",
      [](std::uintptr_t s) {
        py::gil_scoped_release nogil;
        braid::device::synchronize(reinterpret_cast<void*>(s));
      },
      py::arg("stream") = 0, "Blocks until everything on the stream has run.");
  m.def("gpu_status", &braid::gpu_status,
        "What this process can do with GPUs, in one line: 'not built with CUDA', 'no GPU: <why>' or "
        "'N CUDA devices'. Never fails on a host without a GPU or driver.");

  // --- Work -----------------------------------------------------------------------
  py::class_<braid::Work>(m, "Work")
      .def(py::init<>())
      .def(
          "wait",
          [](const braid::Work& w, std::optional<double> timeout) {
            py::gil_scoped_release nogil;
            if (!timeout) {
              w.wait();
              return true;
            }
            return w.wait(ms(timeout));
          },
          py::arg("timeout") = py::none())
      .def("test", &braid::Work::test)
      .def("exception", [](const braid::Work& w) -> py::object { return exception_object(w.exception()); })
      .def("on_complete", &on_complete, py::arg("callback"));

  py::class_<CompletionQueue>(m, "CompletionQueue")
      .def(py::init<>())
      .def("watch", &CompletionQueue::watch, py::arg("works"), py::arg("token"))
      .def("next", &CompletionQueue::next, py::arg("timeout") = py::none())
      .def("close", &CompletionQueue::close)
      .def_property_readonly("closed", &CompletionQueue::closed)
      .def("ready", &CompletionQueue::ready);

  // --- stores ---------------------------------------------------------------------
  py::class_<braid::Store, PyStore, std::shared_ptr<braid::Store>>(m, "Store")
      .def(py::init<>())
      .def(
          "set",
          [](braid::Store& s, const std::string& k, const std::string& v) {
            py::gil_scoped_release nogil;
            s.set(k, v);
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](braid::Store& s, const std::string& k, double timeout) {
            std::string v;
            {
              py::gil_scoped_release nogil;
              v = s.get(k, ms(timeout));
            }
            return py::bytes(v);
          },
          py::arg("key"), py::arg("timeout") = 300.0)
      .def("add",
           [](braid::Store& s, const std::string& k, std::int64_t d) {
             py::gil_scoped_release nogil;
             return s.add(k, d);
           },
           py::arg("key"), py::arg("delta"))
      .def("check",
           [](braid::Store& s, const std::vector<std::string>& keys) {
             py::gil_scoped_release nogil;
             return s.check(keys);
           },
           py::arg("keys"))
      .def(
          "wait",
          [](braid::Store& s, const std::vector<std::string>& keys, double timeout) {
            py::gil_scoped_release nogil;
            s.wait(keys, ms(timeout));
          },
          py::arg("keys"), py::arg("timeout") = 300.0)
      .def(
          "remove",
          [](braid::Store& s, const std::string& k) {
            py::gil_scoped_release nogil;
            return s.remove(k);
          },
          py::arg("key"))
      .def(
          "compare_set",
          [](braid::Store& s, const std::string& k, const std::string& expected, const std::string& desired) {
            std::string v;
            {
              py::gil_scoped_release nogil;
              v = s.compare_set(k, expected, desired);
            }
            return py::bytes(v);
          },
          py::arg("key"), py::arg("expected"), py::arg("desired"));
  py::class_<braid::TcpStore, braid::Store, std::shared_ptr<braid::TcpStore>>(m, "TcpStore")
      .def(py::init([](const std::string& host, std::uint16_t port, bool is_server, double connect_timeout,
                       const std::string& token) {
             py::gil_scoped_release nogil;
             return std::make_shared<braid::TcpStore>(host, port, is_server, ms(connect_timeout), token);
           }),
           py::arg("host"), py::arg("port"), py::arg("is_server") = false, py::arg("connect_timeout") = 60.0,
           py::arg("token") = "")
      .def_property_readonly("port", &braid::TcpStore::port);
  py::class_<braid::FileStore, braid::Store, std::shared_ptr<braid::FileStore>>(m, "FileStore")
      .def(py::init<const std::string&>(), py::arg("path"));
  py::class_<braid::PrefixStore, braid::Store, std::shared_ptr<braid::PrefixStore>>(m, "PrefixStore")
      .def(py::init<std::string, std::shared_ptr<braid::Store>>(), py::arg("prefix"), py::arg("base"));
  py::class_<braid::TcpStoreServer>(m, "TcpStoreServer")
      .def(py::init<const std::string&, std::uint16_t, const std::string&>(), py::arg("bind_addr") = "127.0.0.1",
           py::arg("port") = 0, py::arg("token") = "")
      .def_property_readonly("port", &braid::TcpStoreServer::port);

  // --- Communicator ---------------------------------------------------------------
  py::class_<braid::Communicator>(m, "Communicator")
      .def(py::init([](std::shared_ptr<braid::Store> store, int rank, int size, std::optional<double> timeout,
                       const std::string& name, std::size_t chunk_bytes, const std::string& host_id,
                       const std::string& transport, int device) {
             py::gil_scoped_release nogil;
             return std::make_unique<braid::Communicator>(
                 std::move(store), rank, size, comm_options(timeout, name, chunk_bytes, host_id, transport, device));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout") = py::none(),
           py::arg("name") = "", py::arg("chunk_bytes") = 0, py::arg("host_id") = "", py::arg("transport") = "",
           py::arg("device") = -1)
      .def_static(
          "from_env",
          [](std::optional<double> timeout, const std::string& name, std::size_t chunk_bytes,
             const std::string& host_id, const std::string& transport, int device) {
            py::gil_scoped_release nogil;
            return std::make_unique<braid::Communicator>(
                braid::Communicator::from_env(comm_options(timeout, name, chunk_bytes, host_id, transport, device)));
          },
          py::arg("timeout") = py::none(), py::arg("name") = "", py::arg("chunk_bytes") = 0,
          py::arg("host_id") = "", py::arg("transport") = "", py::arg("device") = -1)
      .def_static(
          "join",
          [](std::shared_ptr<braid::Store> store, int rank, int size, std::optional<double> timeout,
             const std::string& name, std::size_t chunk_bytes, const std::string& host_id, const std::string& transport,
             int device) {
            py::gil_scoped_release nogil;
            return std::make_unique<braid::Communicator>(braid::Communicator::join(
                std::move(store), rank, size, comm_options(timeout, name, chunk_bytes, host_id, transport, device)));
          },
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout") = py::none(), py::arg("name") = "",
          py::arg("chunk_bytes") = 0, py::arg("host_id") = "", py::arg("transport") = "", py::arg("device") = -1)
      .def_static("create_unique_id",
                  []() {
                    braid::UniqueId id;
                    {
                      py::gil_scoped_release nogil;
                      id = braid::Communicator::create_unique_id();
                    }
                    return py::bytes(id.bytes.data(), id.bytes.size());
                  })
      .def_static(
          "from_unique_id",
          [](const std::string& id_bytes, int rank, int size, std::optional<double> timeout,
             const std::string& name, const std::string& transport, int device) {
            if (id_bytes.size() != sizeof(braid::UniqueId::bytes))
              throw braid::Error(braid::ErrorCode::InvalidUsage,
                                 "from_unique_id: a unique id is exactly 128 bytes (from create_unique_id), got " +
                                     std::to_string(id_bytes.size()));
            braid::UniqueId id;
            std::copy(id_bytes.begin(), id_bytes.end(), id.bytes.begin());
            py::gil_scoped_release nogil;
            return std::make_unique<braid::Communicator>(
                braid::Communicator::from_unique_id(id, rank, size,
                                                    comm_options(timeout, name, 0, "", transport, device)));
          },
          py::arg("id"), py::arg("rank"), py::arg("size"), py::arg("timeout") = py::none(), py::arg("name") = "",
          py::arg("transport") = "", py::arg("device") = -1)
      .def_property_readonly("rank", &braid::Communicator::rank)
      .def_property_readonly("size", &braid::Communicator::size)
      .def_property_readonly("local_rank",
                             [](const braid::Communicator& c) {
                               py::gil_scoped_release nogil;
                               return c.local_rank();
                             })
      .def_property_readonly("local_size",
                             [](const braid::Communicator& c) {
                               py::gil_scoped_release nogil;
                               return c.local_size();
                             })
      .def(
          "allreduce",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, braid::ReduceOp op, std::optional<double> timeout, braid::Algorithm algorithm,
             const std::string& codec, const std::string& ef_key, bool deterministic, std::uintptr_t stream,
             double scale) {
            braid::AllreduceOptions o;
            o.scale = scale;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.algorithm = algorithm;
            o.codec = codec;
            o.ef_key = ef_key;
            o.deterministic = deterministic;
            py::gil_scoped_release nogil;
            return c.allreduce(cptr(send), mptr(recv), count, dtype, op, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("timeout") = py::none(), py::arg("algorithm") = braid::Algorithm::automatic,
          py::arg("codec") = "", py::arg("ef_key") = "", py::arg("deterministic") = false, py::arg("stream") = 0,
          py::arg("scale") = 1.0)
      .def(
          "broadcast",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, int root, std::optional<double> timeout, std::uintptr_t stream) {
            braid::BroadcastOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.root = root;
            py::gil_scoped_release nogil;
            return c.broadcast(cptr(send), mptr(recv), count, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "reduce",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, braid::ReduceOp op, int root, std::optional<double> timeout,
             bool deterministic, std::uintptr_t stream, double scale) {
            braid::ReduceOptions o;
            o.scale = scale;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.root = root;
            o.deterministic = deterministic;
            py::gil_scoped_release nogil;
            return c.reduce(cptr(send), mptr(recv), count, dtype, op, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"),
          py::arg("timeout") = py::none(), py::arg("deterministic") = false, py::arg("stream") = 0,
          py::arg("scale") = 1.0)
      .def(
          "allgather",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, std::optional<double> timeout, std::uintptr_t stream) {
            braid::AllgatherOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            py::gil_scoped_release nogil;
            return c.allgather(cptr(send), mptr(recv), count, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "reduce_scatter",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, braid::ReduceOp op, std::optional<double> timeout, bool deterministic, std::uintptr_t stream,
             double scale) {
            braid::ReduceScatterOptions o;
            o.scale = scale;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.deterministic = deterministic;
            py::gil_scoped_release nogil;
            return c.reduce_scatter(cptr(send), mptr(recv), count, dtype, op, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("timeout") = py::none(), py::arg("deterministic") = false, py::arg("stream") = 0,
          py::arg("scale") = 1.0)
      .def(
          "alltoall",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, std::optional<double> timeout, std::uintptr_t stream) {
            braid::AlltoallOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            py::gil_scoped_release nogil;
            return c.alltoall(cptr(send), mptr(recv), count, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "allgatherv",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, const std::vector<std::size_t>& counts,
             braid::DataType dtype, std::optional<double> timeout, std::uintptr_t stream) {
            braid::AllgatherOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            py::gil_scoped_release nogil;
            return c.allgatherv(cptr(send), mptr(recv), counts, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("dtype"), py::arg("timeout") = py::none(),
          py::arg("stream") = 0)
      .def(
          "reduce_scatter_v",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, const std::vector<std::size_t>& counts,
             braid::DataType dtype, braid::ReduceOp op, std::optional<double> timeout, std::uintptr_t stream,
             double scale) {
            braid::ReduceScatterOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.scale = scale;
            py::gil_scoped_release nogil;
            return c.reduce_scatter_v(cptr(send), mptr(recv), counts, dtype, op, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("dtype"), py::arg("op"),
          py::arg("timeout") = py::none(), py::arg("stream") = 0, py::arg("scale") = 1.0)
      .def(
          "alltoallv",
          [](braid::Communicator& c, std::uintptr_t send, const std::vector<std::size_t>& send_counts,
             std::uintptr_t recv, const std::vector<std::size_t>& recv_counts, braid::DataType dtype,
             std::optional<double> timeout, std::uintptr_t stream) {
            braid::AlltoallOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            py::gil_scoped_release nogil;
            return c.alltoallv(cptr(send), send_counts, mptr(recv), recv_counts, dtype, o);
          },
          py::arg("send"), py::arg("send_counts"), py::arg("recv"), py::arg("recv_counts"), py::arg("dtype"),
          py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "gather",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, int root, std::optional<double> timeout, std::uintptr_t stream) {
            braid::GatherOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.root = root;
            py::gil_scoped_release nogil;
            return c.gather(cptr(send), mptr(recv), count, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "scatter",
          [](braid::Communicator& c, std::uintptr_t send, std::uintptr_t recv, std::size_t count,
             braid::DataType dtype, int root, std::optional<double> timeout, std::uintptr_t stream) {
            braid::ScatterOptions o;
            o.timeout = ms(timeout);
            o.stream = reinterpret_cast<void*>(stream);
            o.root = root;
            py::gil_scoped_release nogil;
            return c.scatter(cptr(send), mptr(recv), count, dtype, o);
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def("send", &p2p<true>, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"),
           py::arg("tag") = 0, py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def("recv", &p2p<false>, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"),
           py::arg("tag") = 0, py::arg("timeout") = py::none(), py::arg("stream") = 0)
      .def(
          "barrier",
          [](braid::Communicator& c, std::optional<double> timeout) {
            braid::BarrierOptions o;
            o.timeout = ms(timeout);
            py::gil_scoped_release nogil;
            return c.barrier(o);
          },
          py::arg("timeout") = py::none())
      .def("split",
           [](braid::Communicator& c, int color, int key) {
             py::gil_scoped_release nogil;
             return std::make_unique<braid::Communicator>(c.split(color, key));
           },
           py::arg("color"), py::arg("key"))
      .def("shrink",
           [](braid::Communicator& c, const std::vector<int>& exclude) {
             py::gil_scoped_release nogil;
             return std::make_unique<braid::Communicator>(c.shrink(exclude));
           },
           py::arg("exclude") = std::vector<int>{})
      .def("grow",
           [](braid::Communicator& c, int new_size) {
             py::gil_scoped_release nogil;
             return std::make_unique<braid::Communicator>(c.grow(new_size));
           },
           py::arg("new_size"))
      .def("abort", &braid::Communicator::abort, py::call_guard<py::gil_scoped_release>())
      .def("revoke", &braid::Communicator::revoke, py::call_guard<py::gil_scoped_release>())
      .def("failed", &braid::Communicator::failed)
      .def("describe_topology", &braid::Communicator::describe_topology, py::call_guard<py::gil_scoped_release>())
      .def(
          "link_between_hosts",
          [](braid::Communicator& c) {
            braid::Communicator::LinkMeasurement m;
            {
              py::gil_scoped_release release;
              m = c.link_between_hosts();
            }
            py::dict d;
            d["measured"] = m.measured;
            d["ranks"] = py::make_tuple(m.rank_a, m.rank_b);
            d["latency_us"] = m.latency_us;
            d["bandwidth_gbps"] = m.bandwidth_gbps;
            return d;
          },
          "The link between hosts as codec auto measures it (collective on its first call): a dict with "
          "measured, ranks, latency_us and bandwidth_gbps (GB/s); measured False when every rank is on one host.")
      .def("dump_trace", &braid::Communicator::dump_trace, py::call_guard<py::gil_scoped_release>())
      .def("metrics",
           [](const braid::Communicator& c) {
             braid::Metrics m;
             {
               py::gil_scoped_release nogil;
               m = c.metrics();
             }
             py::list ops;
             for (const auto& o : m.operations) {
               py::dict d;
               d["collective"] = o.collective;
               d["algorithm"] = o.algorithm;
               d["codec"] = o.codec;
               d["calls"] = o.calls;
               d["errors"] = o.errors;
               d["bytes"] = o.bytes;
               d["wire_bytes"] = o.wire_bytes;
               d["seconds"] = o.seconds;
               d["histogram"] = o.histogram;
               ops.append(d);
             }
             py::dict out;
             out["comm"] = m.comm;
             out["rank"] = m.rank;
             out["size"] = m.size;
             out["operations"] = ops;
             out["prometheus"] = m.prometheus();
             return out;
           })
      .def("explain_allreduce", &braid::Communicator::explain_allreduce, py::arg("count"), py::arg("dtype"),
           py::arg("op") = braid::ReduceOp::sum, py::arg("deterministic") = false,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "save_error_feedback",
          [](const braid::Communicator& c, const std::string& key_prefix) {
            std::ostringstream os;
            {
              py::gil_scoped_release nogil;
              c.save_error_feedback(os, key_prefix);
            }
            return py::bytes(os.str());
          },
          py::arg("key_prefix") = "")
      .def(
          "restore_error_feedback",
          [](braid::Communicator& c, const std::string& data, const std::string& key_prefix) {
            std::istringstream is(data);
            py::gil_scoped_release nogil;
            c.restore_error_feedback(is, key_prefix);
          },
          py::arg("data"), py::arg("key_prefix") = "")
      .def("reset_error_feedback", &braid::Communicator::reset_error_feedback, py::arg("ef_key") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("error_feedback_bytes", &braid::Communicator::error_feedback_bytes)
      .def("close", [](braid::Communicator& c) {
        // Destroys the communicator's state now (waits for outstanding work, up to its
        // deadlines) without the GIL; the Python wrapper drops this object afterwards.
        py::gil_scoped_release nogil;
        braid::Communicator gone(std::move(c));
      });
}
