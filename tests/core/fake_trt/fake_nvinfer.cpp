// A fake TensorRT (libnvinfer.so) for the C++ TensorRT executor's tests on a CPU.
//
// It implements, against the real TensorRT 10 headers, what csrc/trt_api.cpp calls:
// createInferRuntime_INTERNAL -> IRuntime -> deserializeCudaEngine -> ICudaEngine (its I/O
// tensors: names, modes, dtypes) -> IExecutionContext (setInputShape, setTensorAddress,
// getTensorShape, enqueueV3, optimization profiles). An "engine" is a small text file naming an ONNX graph and its I/O
// (tests/core/test_trt_executor.py writes one per graph of a slots bundle):
//     onnx <path>
//     onnxruntime <libonnxruntime path>
//     tensor <name> input|output float32|float16|int64 <dim>...    (a dim: a number or a symbol)
//     profile <index> <input> min <dims...> max <dims...>            (the optimization profiles' boxes)
// enqueueV3 runs the graph with onnxruntime over the addresses it was given, which the fake CUDA
// driver (fake_cuda.cpp) makes host memory, with the shapes set, once the work queued on the stream before
// it has run; an output's shape resolves its
// symbols from the inputs'. Every other API call answers a default and is never used by the executor.
#include <NvInferRuntime.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fake_stream.h"
#include "ort_executor.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

using namespace nvinfer1;

namespace fake {

struct Tensor {
  std::string name;
  bool input = false;
  DataType type = DataType::kFLOAT;
  dflash::DType dtype = dflash::DType::float32;
  std::vector<std::string> dims;
};

// One optimization profile: input -> (min dims, max dims).
using Profile = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

struct Spec {
  std::string onnx, library;
  std::vector<Tensor> tensors;
  std::vector<Profile> profiles;
  const Tensor* find(const char* name) const {
    for (const Tensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

Spec parse(const std::string& text) {
  Spec spec;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "onnx") words >> spec.onnx;
    if (kind == "onnxruntime") words >> spec.library;
    if (kind == "profile") {  // profile <index> <input> min <dims...> max <dims...>
      size_t index;
      std::string name, word;
      words >> index >> name;
      if (spec.profiles.size() <= index) spec.profiles.resize(index + 1);
      std::vector<int64_t>* into = nullptr;
      while (words >> word) {
        if (word == "min" || word == "max") {
          into = word == "min" ? &spec.profiles[index][name].first : &spec.profiles[index][name].second;
        } else if (into) {
          into->push_back(std::stoll(word));
        }
      }
    }
    if (kind != "tensor") continue;
    Tensor t;
    std::string mode, type, dim;
    words >> t.name >> mode >> type;
    t.input = mode == "input";
    if (type == "float16") {
      t.type = DataType::kHALF;
      t.dtype = dflash::DType::float16;
    } else if (type == "int64") {
      t.type = DataType::kINT64;
      t.dtype = dflash::DType::int64;
    }
    while (words >> dim) t.dims.push_back(dim);
    spec.tensors.push_back(t);
  }
  return spec;
}

ILogger* logger = nullptr;

void error(const std::string& message) {
  if (logger) logger->log(ILogger::Severity::kERROR, message.c_str());
}

class Engine;

class ContextImpl final : public apiv::VExecutionContext {
 public:
  ContextImpl(const Engine& engine, const Spec& spec, std::unique_ptr<dflash::Graph> graph)
      : engine_(engine), spec_(spec), graph_(std::move(graph)) {}
  IExecutionContext* api = nullptr;

  // Like TensorRT: a shape outside the context's profile is refused.
  bool setInputShape(char const* name, Dims const& dims) noexcept override {
    const Tensor* t = spec_.find(name);
    if (!t || !t->input || dims.nbDims != int32_t(t->dims.size())) return false;
    auto box = spec_.profiles.at(profile_).find(name);
    if (box != spec_.profiles[profile_].end())
      for (int32_t i = 0; i < dims.nbDims; ++i)
        if (dims.d[i] < box->second.first[i] || dims.d[i] > box->second.second[i]) {
          error(std::string("fake TensorRT: ") + name + " is outside profile " + std::to_string(profile_));
          return false;
        }
    shapes_[name].assign(dims.d, dims.d + dims.nbDims);
    return true;
  }
  bool setOptimizationProfileAsync(int32_t index, cudaStream_t) noexcept override {
    if (index < 0 || index >= int32_t(spec_.profiles.size())) return false;
    profile_ = index;
    shapes_.clear();
    return true;
  }
  int32_t getOptimizationProfile() const noexcept override { return profile_; }
  Dims getTensorShape(char const* name) const noexcept override {
    Dims dims{};
    const Tensor* t = spec_.find(name);
    if (!t) {
      dims.nbDims = -1;
      return dims;
    }
    const std::vector<int64_t> shape = resolve(*t);
    dims.nbDims = int32_t(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) dims.d[i] = shape[i];
    return dims;
  }
  bool setTensorAddress(char const* name, void* data) noexcept override {
    if (!spec_.find(name)) return false;
    addresses_[name] = data;
    return true;
  }
  void const* getTensorAddress(char const* name) const noexcept override {
    auto found = addresses_.find(name);
    return found == addresses_.end() ? nullptr : found->second;
  }
  bool enqueueV3(cudaStream_t stream) noexcept override {
    try {
      // the bindings as they are now: a CUDA graph captured here replays them, whatever is set later
      std::vector<std::pair<const Tensor*, dflash::TensorRef>> bound;
      for (bool inputs : {true, false})  // inputs first: an output bound to an input's memory reuses its value
        for (const Tensor& t : spec_.tensors) {
          if (t.input != inputs) continue;
          auto address = addresses_.find(t.name);
          if (address == addresses_.end()) {
            error("fake TensorRT: tensor " + t.name + " has no address");
            return false;
          }
          bound.emplace_back(&t, dflash::TensorRef{address->second, t.dtype, resolve(t)});
        }
      FakeStream& fake = *reinterpret_cast<FakeStream*>(stream);
      if (fake.capturing()) {  // recorded into the graph, run at each of its launches
        fake.enqueue([this, bound] { run(bound); });
        return true;
      }
      fake.flush();  // the run reads what the work queued before it wrote (uploads, kernels): that work first
      run(bound);
      return true;
    } catch (const std::exception& e) {
      error(e.what());
      return false;
    }
  }
  ICudaEngine const& getEngine() const noexcept override;

 private:
  void run(const std::vector<std::pair<const Tensor*, dflash::TensorRef>>& bound) {
    graph_->clear();
    for (const auto& [t, ref] : bound) {
      if (t->input)
        graph_->input(t->name, ref);
      else
        graph_->output(t->name, ref);
    }
    graph_->run("fake TensorRT enqueueV3");
  }
  // An input's set shape; an output's dims with each symbol read off the inputs' shapes.
  std::vector<int64_t> resolve(const Tensor& t) const {
    if (t.input) {
      auto found = shapes_.find(t.name);
      return found == shapes_.end() ? std::vector<int64_t>(t.dims.size(), -1) : found->second;
    }
    std::map<std::string, int64_t> symbols;
    for (const Tensor& in : spec_.tensors) {
      auto found = shapes_.find(in.name);
      if (!in.input || found == shapes_.end()) continue;
      for (size_t i = 0; i < in.dims.size(); ++i) symbols[in.dims[i]] = found->second[i];
    }
    std::vector<int64_t> shape;
    for (const std::string& dim : t.dims) {  // a number, a symbol, or a symbol -/+ a number ("block-1")
      if (dim.find_first_not_of("0123456789") == std::string::npos) {
        shape.push_back(std::stoll(dim));
        continue;
      }
      const size_t sign = dim.find_first_of("+-");
      auto symbol = symbols.find(dim.substr(0, sign));
      const int64_t offset = sign == std::string::npos ? 0 : std::stoll(dim.substr(sign));
      shape.push_back(symbol == symbols.end() ? -1 : symbol->second + offset);
    }
    return shape;
  }

  const Engine& engine_;
  const Spec& spec_;
  std::unique_ptr<dflash::Graph> graph_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, void*> addresses_;
  int32_t profile_ = 0;

 public:
  IExecutionContext* getPImpl() noexcept override { return {}; }
  void setDebugSync(bool sync) noexcept override {}
  bool getDebugSync() const noexcept override { return {}; }
  void setProfiler(IProfiler*) noexcept override {}
  IProfiler* getProfiler() const noexcept override { return {}; }
  void setName(char const* name) noexcept override {}
  char const* getName() const noexcept override { return {}; }
  void setDeviceMemory(void* memory) noexcept override {}
  bool allInputDimensionsSpecified() const noexcept override { return {}; }
  bool allInputShapesSpecified() const noexcept override { return {}; }
  void setErrorRecorder(IErrorRecorder* recorder) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return {}; }
  bool executeV2(void* const* bindings) noexcept override { return {}; }
  void setEnqueueEmitsProfile(bool enqueueEmitsProfile) noexcept override {}
  bool getEnqueueEmitsProfile() const noexcept override { return {}; }
  bool reportToProfiler() const noexcept override { return {}; }
  Dims getTensorStrides(char const* tensorName) const noexcept override { return {}; }
  bool setInputTensorAddress(char const* tensorName, void const* data) noexcept override { return {}; }
  bool setOutputTensorAddress(char const* tensorName, void* data) noexcept override { return {}; }
  int32_t inferShapes(int32_t nbMaxNames, char const** tensorNames) noexcept override { return {}; }
  bool setInputConsumedEvent(cudaEvent_t event) noexcept override { return {}; }
  cudaEvent_t getInputConsumedEvent() const noexcept override { return {}; }
  void* getOutputTensorAddress(char const* tensorName) const noexcept override { return {}; }
  bool setOutputAllocator(char const* tensorName, IOutputAllocator* outputAllocator) noexcept override { return {}; }
  IOutputAllocator* getOutputAllocator(char const* name) noexcept override { return {}; }
  int64_t getMaxOutputSize(char const* tensorName) const noexcept override { return {}; }
  bool setTemporaryStorageAllocator(IGpuAllocator* allocator) noexcept override { return {}; }
  IGpuAllocator* getTemporaryStorageAllocator() const noexcept override { return {}; }
  void setPersistentCacheLimit(size_t size) noexcept override {}
  size_t getPersistentCacheLimit() const noexcept override { return {}; }
  bool setNvtxVerbosity(ProfilingVerbosity verbosity) noexcept override { return {}; }
  ProfilingVerbosity getNvtxVerbosity() const noexcept override { return {}; }
  void setAuxStreams(cudaStream_t* auxStreams, int32_t nbStreams) noexcept override {}
  bool setDebugListener(IDebugListener* listener) noexcept override { return {}; }
  IDebugListener* getDebugListener() noexcept override { return {}; }
  bool setTensorDebugState(char const* name, bool flag) noexcept override { return {}; }
  bool getDebugState(char const* name) const noexcept override { return {}; }
  bool setAllTensorsDebugState(bool flag) noexcept override { return {}; }
  size_t updateDeviceMemorySizeForShapes() noexcept override { return {}; }
  void setDeviceMemoryV2(void* memory, int64_t size) noexcept override {}
  IRuntimeConfig* getRuntimeConfig() const noexcept override { return {}; }
  bool setUnfusedTensorsDebugState(bool flag) noexcept override { return {}; }
  bool getUnfusedTensorsDebugState() const noexcept override { return {}; }
};

class Context final : public IExecutionContext {
 public:
  explicit Context(ContextImpl* impl) {
    mImpl = impl;
    impl->api = this;
  }
  ~Context() noexcept override { delete mImpl; }
};

class EngineImpl final : public apiv::VCudaEngine {
 public:
  explicit EngineImpl(Spec spec) : spec_(std::move(spec)), backend_(spec_.library, 1) {}
  const Engine* api = nullptr;

  IExecutionContext* createExecutionContext(ExecutionContextAllocationStrategy) noexcept override;
  DataType getTensorDataType(char const* name) const noexcept override {
    const Tensor* t = spec_.find(name);
    return t ? t->type : DataType::kFLOAT;
  }
  TensorIOMode getTensorIOMode(char const* name) const noexcept override {
    const Tensor* t = spec_.find(name);
    return !t ? TensorIOMode::kNONE : t->input ? TensorIOMode::kINPUT : TensorIOMode::kOUTPUT;
  }
  int32_t getNbIOTensors() const noexcept override { return int32_t(spec_.tensors.size()); }
  char const* getIOTensorName(int32_t index) const noexcept override { return spec_.tensors[index].name.c_str(); }
  Dims getTensorShape(char const* name) const noexcept override {
    Dims dims{};
    const Tensor* t = spec_.find(name);
    dims.nbDims = t ? int32_t(t->dims.size()) : -1;
    for (int32_t i = 0; i < dims.nbDims; ++i) dims.d[i] = -1;
    return dims;
  }
  char const* getName() const noexcept override { return spec_.onnx.c_str(); }
  int32_t getNbOptimizationProfiles() const noexcept override { return int32_t(spec_.profiles.size()); }
  Dims getProfileShape(char const* name, int32_t index, OptProfileSelector select) const noexcept override {
    Dims dims{};
    dims.nbDims = -1;
    if (index < 0 || index >= int32_t(spec_.profiles.size())) return dims;
    auto box = spec_.profiles[index].find(name);
    if (box == spec_.profiles[index].end()) return dims;
    const std::vector<int64_t>& d = select == OptProfileSelector::kMIN ? box->second.first : box->second.second;
    dims.nbDims = int32_t(d.size());
    for (size_t i = 0; i < d.size(); ++i) dims.d[i] = d[i];
    return dims;
  }
  ICudaEngine* getPImpl() noexcept override { return {}; }
  int32_t getNbLayers() const noexcept override { return {}; }
  IHostMemory* serialize() const noexcept override { return {}; }
  IExecutionContext* createExecutionContextWithoutDeviceMemory() noexcept override { return {}; }
  size_t getDeviceMemorySize() const noexcept override { return {}; }
  bool isRefittable() const noexcept override { return {}; }
  int32_t const* getProfileTensorValues( char const* tensorName, int32_t profileIndex, OptProfileSelector select) const noexcept override { return {}; }
  EngineCapability getEngineCapability() const noexcept override { return {}; }
  void setErrorRecorder(IErrorRecorder* recorder) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return {}; }
  bool hasImplicitBatchDimension() const noexcept override { return {}; }
  TacticSources getTacticSources() const noexcept override { return {}; }
  ProfilingVerbosity getProfilingVerbosity() const noexcept override { return {}; }
  IEngineInspector* createEngineInspector() const noexcept override { return {}; }
  TensorLocation getTensorLocation(char const* tensorName) const noexcept override { return {}; }
  bool isShapeInferenceIO(char const* tensorName) const noexcept override { return {}; }
  int32_t getTensorBytesPerComponent(char const* tensorName) const noexcept override { return {}; }
  int32_t getTensorComponentsPerElement(char const* tensorName) const noexcept override { return {}; }
  TensorFormat getTensorFormat(char const* tensorName) const noexcept override { return {}; }
  char const* getTensorFormatDesc(char const* tensorName) const noexcept override { return {}; }
  int32_t getTensorVectorizedDim(char const* tensorName) const noexcept override { return {}; }
  HardwareCompatibilityLevel getHardwareCompatibilityLevel() const noexcept override { return {}; }
  int32_t getNbAuxStreams() const noexcept override { return {}; }
  int32_t getTensorBytesPerComponentV2(char const* tensorName, int32_t profileIndex) const noexcept override { return {}; }
  int32_t getTensorComponentsPerElementV2(char const* tensorName, int32_t profileIndex) const noexcept override { return {}; }
  TensorFormat getTensorFormatV2(char const* tensorName, int32_t profileIndex) const noexcept override { return {}; }
  char const* getTensorFormatDescV2(char const* tensorName, int32_t profileIndex) const noexcept override { return {}; }
  int32_t getTensorVectorizedDimV2(char const* tensorName, int32_t profileIndex) const noexcept override { return {}; }
  ISerializationConfig* createSerializationConfig() noexcept override { return {}; }
  IHostMemory* serializeWithConfig(ISerializationConfig& config) const noexcept override { return {}; }
  size_t getDeviceMemorySizeForProfile(int32_t profileIndex) const noexcept override { return {}; }
  IRefitter* createRefitter(ILogger& logger) noexcept override { return {}; }
  bool setWeightStreamingBudget(int64_t gpuMemoryBudget) noexcept override { return {}; }
  int64_t getWeightStreamingBudget() const noexcept override { return {}; }
  int64_t getMinimumWeightStreamingBudget() const noexcept override { return {}; }
  int64_t getStreamableWeightsSize() const noexcept override { return {}; }
  bool isDebugTensor(char const* name) const noexcept override { return {}; }
  bool setWeightStreamingBudgetV2(int64_t gpuMemoryBudget) noexcept override { return {}; }
  int64_t getWeightStreamingBudgetV2() const noexcept override { return {}; }
  int64_t getWeightStreamingAutomaticBudget() const noexcept override { return {}; }
  int64_t getWeightStreamingScratchMemorySize() const noexcept override { return {}; }
  int64_t getDeviceMemorySizeV2() const noexcept override { return {}; }
  int64_t getDeviceMemorySizeForProfileV2(int32_t profileIndex) const noexcept override { return {}; }
  int64_t const* getProfileTensorValuesV2( char const* tensorName, int32_t profileIndex, OptProfileSelector select) const noexcept override { return {}; }
  IExecutionContext* createExecutionContextWithRuntimeConfig( IRuntimeConfig* runtimeConfig) noexcept override { return {}; }
  IRuntimeConfig* createRuntimeConfig() noexcept override { return {}; }
  int64_t getEngineStat(EngineStat stat) const noexcept override { return {}; }

 private:
  Spec spec_;
  dflash::OrtBackend backend_;
};

class Engine final : public ICudaEngine {
 public:
  explicit Engine(EngineImpl* impl) {
    mImpl = impl;
    impl->api = this;
  }
  ~Engine() noexcept override { delete mImpl; }
};

IExecutionContext* EngineImpl::createExecutionContext(ExecutionContextAllocationStrategy) noexcept {
  try {
    return new Context(new ContextImpl(*api, spec_, backend_.open(spec_.onnx)));
  } catch (const std::exception& e) {
    error(e.what());
    return nullptr;
  }
}

ICudaEngine const& ContextImpl::getEngine() const noexcept { return engine_; }

class RuntimeImpl final : public apiv::VRuntime {
 public:
  nvinfer1::ICudaEngine* deserializeCudaEngine(void const* blob, std::size_t size) noexcept override {
    try {
      Spec spec = parse(std::string(static_cast<const char*>(blob), size));
      if (spec.onnx.empty() || spec.tensors.empty() || spec.profiles.empty()) {
        error("fake TensorRT: not a fake engine");
        return nullptr;
      }
      return new Engine(new EngineImpl(std::move(spec)));
    } catch (const std::exception& e) {
      error(e.what());
      return nullptr;
    }
  }
  IRuntime* getPImpl() noexcept override { return {}; }
  nvinfer1::ICudaEngine* deserializeCudaEngine(IStreamReader& streamReader) noexcept override { return {}; }
  void setDLACore(int32_t dlaCore) noexcept override {}
  int32_t getDLACore() const noexcept override { return {}; }
  int32_t getNbDLACores() const noexcept override { return {}; }
  void setGpuAllocator(IGpuAllocator* allocator) noexcept override {}
  void setErrorRecorder(IErrorRecorder* recorder) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return {}; }
  ILogger* getLogger() const noexcept override { return {}; }
  bool setMaxThreads(int32_t maxThreads) noexcept override { return {}; }
  int32_t getMaxThreads() const noexcept override { return {}; }
  void setTemporaryDirectory(char const*) noexcept override {}
  char const* getTemporaryDirectory() const noexcept override { return {}; }
  void setTempfileControlFlags(TempfileControlFlags) noexcept override {}
  TempfileControlFlags getTempfileControlFlags() const noexcept override { return {}; }
  IPluginRegistry& getPluginRegistry() noexcept override { std::abort(); }
  void setPluginRegistryParent(IPluginRegistry* parent) noexcept override {}
  IRuntime* loadRuntime(char const* path) noexcept override { return {}; }
  void setEngineHostCodeAllowed(bool allowed) noexcept override {}
  bool getEngineHostCodeAllowed() const noexcept override { return {}; }
  nvinfer1::ICudaEngine* deserializeCudaEngineV2(IStreamReaderV2& streamReader) noexcept override { return {}; }
};

class Runtime final : public IRuntime {
 public:
  Runtime() { mImpl = new RuntimeImpl(); }
  ~Runtime() noexcept override { delete mImpl; }
};

}  // namespace fake

EXPORT void* createInferRuntime_INTERNAL(void* logger, int32_t) noexcept {
  fake::logger = static_cast<ILogger*>(logger);
  return static_cast<IRuntime*>(new fake::Runtime());
}

EXPORT int32_t getInferLibVersion() noexcept { return NV_TENSORRT_VERSION; }
