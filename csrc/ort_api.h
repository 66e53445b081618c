// ort_api.h: the onnxruntime C API, loaded at run time, with owners for its handles.
//
// The library is dlopen'ed from a path the caller gives (the onnxruntime wheel ships
// onnxruntime/capi/libonnxruntime.so.<version>; dflash_trt/runtime/ort_executor.py finds it), so
// the core links no onnxruntime and builds without one installed. We ask for the API version of the
// headers we compile against (1.21, scripts/fetch_headers.sh); a newer library serves it too.
// Every OrtStatus becomes a dflash::Error carrying onnxruntime's own message.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "errors.h"

namespace dflash::ort {

// A move-only owner of one onnxruntime handle, freed with the API's matching Release* call.
template <typename T>
class Handle {
 public:
  using Release = void (*)(T*);
  Handle() = default;
  Handle(T* p, Release release) : p_(p), release_(release) {}
  Handle(Handle&& o) noexcept : p_(o.p_), release_(o.release_) { o.p_ = nullptr; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      release_ = o.release_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  T* get() const { return p_; }
  void reset() {
    if (p_) release_(p_);
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
  Release release_ = nullptr;
};

using Session = Handle<OrtSession>;
using Value = Handle<OrtValue>;
using Binding = Handle<OrtIoBinding>;

// One loaded library: its API table, one environment and the CPU memory description every tensor
// over host memory uses. Shared by the sessions made from it; the library itself is never unloaded
// (onnxruntime keeps threads and statics alive until exit).
class Runtime {
 public:
  // Loads `library_path` once per process (later calls with the same path share it).
  static std::shared_ptr<Runtime> load(const std::string& library_path);

  const OrtApi& api() const { return *api_; }
  std::string version() const { return version_; }

  // Throws dflash::Error("onnxruntime: <what>: <message>") when `status` is an error; frees it.
  void check(OrtStatus* status, const std::string& what) const;

  // A CPU session over `path` with `threads` intra-op threads (0: onnxruntime's default).
  Session open(const std::string& path, int64_t threads) const;
  // A tensor over caller-owned host memory (no copy): the memory must outlive every run using it.
  Value tensor(void* data, ONNXTensorElementDataType type, size_t element_size, const std::vector<int64_t>& shape) const;
  Binding binding(const Session& session) const;

  // One Run through a binding: clear it, bind (an output may be bound to the very value an input
  // is: the graph then writes that buffer in place), run. Outputs land in the bound memory.
  void clear(const Binding& binding) const;
  void bind_input(const Binding& binding, const std::string& name, const Value& value) const;
  void bind_output(const Binding& binding, const std::string& name, const Value& value) const;
  void run(const Session& session, const Binding& binding, const std::string& what) const;

 private:
  Runtime(const OrtApi* api, std::string version);

  const OrtApi* api_;
  std::string version_;
  Handle<OrtEnv> env_;
  Handle<OrtMemoryInfo> cpu_;
};

}  // namespace dflash::ort
