// ort_api.cpp: loading libonnxruntime with dlopen, and the few calls every executor needs.
#include "ort_api.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <numeric>

namespace dflash::ort {


std::shared_ptr<Runtime> Runtime::load(const std::string& library_path) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<Runtime>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = loaded[library_path].lock()) return found;

  // RTLD_LOCAL: the onnxruntime Python module may hold its own copy of the runtime in this process;
  // keeping our symbols private stops either from binding to the other's.
  void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = dlerror();
    throw Error("cannot load onnxruntime from " + library_path + " (" + (why ? why : "unknown error") +
                "): pip install onnxruntime, or pass the path of libonnxruntime.so");
  }
  using GetApiBase = const OrtApiBase* (*)();
  auto get_base = reinterpret_cast<GetApiBase>(dlsym(library, "OrtGetApiBase"));
  if (!get_base) throw Error(library_path + " is not an onnxruntime library (no OrtGetApiBase)");
  const OrtApiBase* base = get_base();
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api)
    throw Error("onnxruntime " + std::string(base->GetVersionString()) + " at " + library_path +
                " is older than the C API version " + std::to_string(ORT_API_VERSION) +
                " the core was built for: upgrade onnxruntime");
  std::shared_ptr<Runtime> runtime(new Runtime(api, base->GetVersionString()));
  loaded[library_path] = runtime;
  return runtime;
}

Runtime::Runtime(const OrtApi* api, std::string version) : api_(api), version_(std::move(version)) {
  OrtEnv* env = nullptr;
  check(api_->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "dflash", &env), "creating the environment");
  env_ = Handle<OrtEnv>(env, api_->ReleaseEnv);
  OrtMemoryInfo* cpu = nullptr;
  check(api_->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &cpu), "describing host memory");
  cpu_ = Handle<OrtMemoryInfo>(cpu, api_->ReleaseMemoryInfo);
}

void Runtime::check(OrtStatus* status, const std::string& what) const {
  if (!status) return;
  std::string message = api_->GetErrorMessage(status);
  api_->ReleaseStatus(status);
  throw Error("onnxruntime: " + what + ": " + message);
}

Session Runtime::open(const std::string& path, int64_t threads) const {
  OrtSessionOptions* raw = nullptr;
  check(api_->CreateSessionOptions(&raw), "creating session options");
  Handle<OrtSessionOptions> options(raw, api_->ReleaseSessionOptions);
  if (threads > 0) check(api_->SetIntraOpNumThreads(raw, int(threads)), "setting intra-op threads");
  // The three sessions take turns; idle workers left spinning after one Run steal the cores the
  // next session needs (the Python backend measured 2x on 2 cores: op_library.session_options).
  check(api_->AddSessionConfigEntry(raw, "session.force_spinning_stop", "1"), "setting session options");
  // A memory pattern is planned and kept per input shape, and ours change every step: disabled, a
  // batch of 32 varied requests x 16 rounds grew the process by 58 MiB instead of 141 MiB, at the
  // same speed.
  check(api_->DisableMemPattern(raw), "disabling memory patterns");
  // The CPU arena keeps the largest step's intermediates for the life of the process (a server's
  // Python stub grew ~200 MiB under a soak and kept it); without it they go back to malloc, whose free
  // pages an idle engine returns (release_host_memory). Measured on the embedded pair, a step of 1 /
  // 8 rows: 0 / +1.5 % (scripts/bench_ort_executor.py, arena on and off alternated three times);
  // `dflash-trt bench` (16 HumanEval prompts, 64 tokens) 63.5 / 62.3 tok/s DFlash auto / B=4 without
  // it, 61.6 / 64.3 with it, the same run's noise.
  check(api_->DisableCpuMemArena(raw), "disabling the memory arena");
  OrtSession* session = nullptr;
  check(api_->CreateSession(env_.get(), path.c_str(), raw, &session), "loading " + path);
  return Session(session, api_->ReleaseSession);
}

Value Runtime::tensor(void* data, ONNXTensorElementDataType type, size_t element_size,
                     const std::vector<int64_t>& shape) const {
  const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
  DFLASH_INVARIANT(count >= 0 && (data || count == 0));
  OrtValue* value = nullptr;
  check(api_->CreateTensorWithDataAsOrtValue(cpu_.get(), data, size_t(count) * element_size, shape.data(),
                                             shape.size(), type, &value),
        "wrapping a host buffer");
  return Value(value, api_->ReleaseValue);
}

Binding Runtime::binding(const Session& session) const {
  OrtIoBinding* binding = nullptr;
  check(api_->CreateIoBinding(session.get(), &binding), "creating an I/O binding");
  return Binding(binding, api_->ReleaseIoBinding);
}

void Runtime::clear(const Binding& binding) const {
  api_->ClearBoundInputs(binding.get());
  api_->ClearBoundOutputs(binding.get());
}

void Runtime::bind_input(const Binding& binding, const std::string& name, const Value& value) const {
  check(api_->BindInput(binding.get(), name.c_str(), value.get()), "binding input " + name);
}

void Runtime::bind_output(const Binding& binding, const std::string& name, const Value& value) const {
  check(api_->BindOutput(binding.get(), name.c_str(), value.get()), "binding output " + name);
}

void Runtime::run(const Session& session, const Binding& binding, const std::string& what) const {
  check(api_->RunWithBinding(session.get(), nullptr, binding.get()), what);
}

}  // namespace dflash::ort
