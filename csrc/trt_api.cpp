// trt_api.cpp: TensorRT through dlopen; TensorRT engines as slot-executor graphs.
#include "trt_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>

namespace dflash::trt {

namespace {

constexpr char kWhy[] = "the C++ TensorRT executor";

void* symbol(void* library, const char* name, const std::string& where) {
  void* found = dlsym(library, name);
  if (!found) throw Error(std::string(kWhy) + ": " + where + " has no " + name);
  return found;
}

}  // namespace

void Logger::log(Severity severity, const char* message) noexcept {
  if (severity <= Severity::kERROR) last_error_ = message ? message : "";
}

namespace {

nvinfer1::DataType trt_type(DType t) {
  switch (t) {
    case DType::float32: return nvinfer1::DataType::kFLOAT;
    case DType::float16: return nvinfer1::DataType::kHALF;
    case DType::bfloat16: return nvinfer1::DataType::kBF16;
    case DType::int64: return nvinfer1::DataType::kINT64;
  }
  DFLASH_INVARIANT(false);
  return nvinfer1::DataType::kFLOAT;
}

size_t trt_size(nvinfer1::DataType t) {
  switch (t) {
    case nvinfer1::DataType::kINT64: return 8;
    case nvinfer1::DataType::kFLOAT:
    case nvinfer1::DataType::kINT32: return 4;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16: return 2;
    default: return 1;
  }
}

// One engine and an execution context per optimization profile (`build` makes one profile per
// phase: prefill, verify, ...). A run takes the first profile whose box holds every input's shape.
// Outputs the executor does not bind (draft_logits) go to scratch sized from the shapes the inputs
// imply.
//
// With `graphed`, a run of at most kGraphedTokens new tokens per row (decode, verify, draft steps; the
// first input bound: [rows, tokens, ...]) is captured as a CUDA graph around enqueueV3 the second time
// its bindings (profile, shapes, addresses) recur, and replayed from then on (as the torch graphs
// capture their forward: runtime/torch_graphs.py). The first run of a binding is eager, so TensorRT
// has done its shape-dependent setup before the capture. Prefill chunks stay eager.
class TrtGraph final : public Graph {
 public:
  static constexpr int64_t kGraphedTokens = 16;  // torch_graphs.GRAPHED_TOKENS
  static constexpr size_t kGraphsKept = 64;      // per graph; later bindings run eagerly

  TrtGraph(nvinfer1::ICudaEngine* engine, CudaDevice& device, Logger& logger, std::string path, bool graphed)
      : engine_(engine), device_(device), logger_(logger), path_(std::move(path)), graphed_(graphed) {
    for (int32_t i = 0; i < engine_->getNbIOTensors(); ++i) names_.emplace_back(engine_->getIOTensorName(i));
    for (int32_t p = 0; p < std::max(engine_->getNbOptimizationProfiles(), 1); ++p) {
      contexts_.push_back(engine_->createExecutionContext());
      if (!contexts_.back()) fail("creating an execution context for " + path_);
      if (!contexts_.back()->setOptimizationProfileAsync(p, device_.stream()))
        fail(path_ + ": selecting optimization profile " + std::to_string(p));
    }
    device_.synchronize();
  }
  ~TrtGraph() override {
    for (const auto& [key, graph] : graphs_) device_.destroy(graph);
    for (nvinfer1::IExecutionContext* context : contexts_) delete context;
    delete engine_;
  }

  void clear() override {
    inputs_.clear();
    outputs_.clear();
    first_shape_.clear();
  }
  void input(const std::string& name, const TensorRef& t) override {
    check(name, t, nvinfer1::TensorIOMode::kINPUT);
    if (t.shape.size() > size_t(nvinfer1::Dims::MAX_DIMS)) fail(name + ": too many dimensions");
    if (inputs_.empty()) first_shape_ = t.shape;
    inputs_[name] = t;
  }
  void output(const std::string& name, const TensorRef& t) override {
    check(name, t, nvinfer1::TensorIOMode::kOUTPUT);
    outputs_[name] = t.data;
  }
  bool run(const std::string& what) override {
    const int32_t profile = fitting_profile();
    if (profile < 0) fail(what + ": " + shapes() + " are outside every optimization profile of " + path_ +
                          ": rebuild with a larger --max-batch / --max-seq-len");
    nvinfer1::IExecutionContext* context = contexts_[profile];
    std::string key = std::to_string(profile);  // the bindings a captured graph is valid for
    const auto keyed = [&key](const std::string& name, const void* data, const std::vector<int64_t>* shape) {
      key += '|' + name + '@' + std::to_string(reinterpret_cast<uintptr_t>(data));
      if (shape) key += shape_text(*shape);
    };
    for (const auto& [name, t] : inputs_) {
      nvinfer1::Dims dims{};
      dims.nbDims = int32_t(t.shape.size());
      for (size_t i = 0; i < t.shape.size(); ++i) dims.d[i] = t.shape[i];
      if (!context->setInputShape(name.c_str(), dims)) fail(what + ": setting the shape of " + name);
      bind(context, name, t.data);
      keyed(name, t.data, &t.shape);
    }
    for (const std::string& name : names_) {
      if (inputs_.count(name)) continue;
      if (engine_->getTensorIOMode(name.c_str()) == nvinfer1::TensorIOMode::kINPUT)
        fail(what + ": input " + name + " is not bound");
      auto bound = outputs_.find(name);
      if (bound != outputs_.end()) {
        bind(context, name, bound->second);
        keyed(name, bound->second, nullptr);
        continue;
      }
      const nvinfer1::Dims dims = context->getTensorShape(name.c_str());
      size_t count = 1;
      for (int32_t i = 0; i < dims.nbDims; ++i) count *= size_t(std::max<int64_t>(dims.d[i], 0));
      Buffer& buffer = scratch_.emplace(name, Buffer(device_, DType::float32)).first->second;
      buffer.reserve((count * trt_size(engine_->getTensorDataType(name.c_str())) + 3) / 4);
      bind(context, name, buffer.at(0));
      keyed(name, buffer.at(0), nullptr);
    }
    // decode-sized runs (a prefill chunk's shapes are too many to remember) count their set-up: the
    // first enqueue of a binding, then its capture
    const bool decode_sized = first_shape_.size() >= 2 && first_shape_[1] <= kGraphedTokens;
    const bool first = decode_sized && first_runs_.first(key);
    Replay replay = Replay::eager;
    if (decode_sized && graphed_ && !first) {
      replay = replay_or_capture(key, context);
      if (replay == Replay::replayed || replay == Replay::captured) return replay == Replay::captured;
    }
    if (!context->enqueueV3(device_.stream())) fail(what);
    return first || replay == Replay::capture_failed;
  }

 private:
  enum class Replay { replayed, captured, capture_failed, eager };
  // Replays the graph captured for `key`, or captures it (the second time `key` runs) and launches it;
  // capture_failed, eager: run it eagerly (past kGraphsKept graphs, eager from then on).
  Replay replay_or_capture(const std::string& key, nvinfer1::IExecutionContext* context) {
    auto found = graphs_.find(key);
    if (found == graphs_.end()) {
      if (captured_ >= kGraphsKept) {
        graphs_.emplace(key, nullptr);
        return Replay::eager;
      }
      CUgraphExec graph = device_.capture([&] { return context->enqueueV3(device_.stream()); });
      graphs_.emplace(key, graph);
      if (!graph) return Replay::capture_failed;
      ++captured_;
      device_.launch(graph);
      return Replay::captured;
    }
    if (!found->second) return Replay::eager;
    device_.launch(found->second);
    return Replay::replayed;
  }
  [[noreturn]] void fail(const std::string& what) const {
    const std::string why = logger_.last_error();
    throw Error("TensorRT: " + what + (why.empty() ? "" : ": " + why));
  }
  void check(const std::string& name, const TensorRef& t, nvinfer1::TensorIOMode mode) const {
    if (std::find(names_.begin(), names_.end(), name) == names_.end())
      fail(path_ + " has no tensor " + name + ": not a graph-contract-2 engine bundle");
    if (engine_->getTensorIOMode(name.c_str()) != mode)
      fail(path_ + ": " + name + " is not an " + (mode == nvinfer1::TensorIOMode::kINPUT ? "input" : "output"));
    if (engine_->getTensorDataType(name.c_str()) != trt_type(t.dtype))
      fail(path_ + ": " + name + " has another element type than the bundle's dtype says: rebuild the engines");
  }
  void bind(nvinfer1::IExecutionContext* context, const std::string& name, void* data) const {
    if (!context->setTensorAddress(name.c_str(), data)) fail(path_ + ": binding " + name);
  }
  int32_t fitting_profile() const {
    for (int32_t p = 0; p < int32_t(contexts_.size()); ++p) {
      bool fits = true;
      for (const auto& [name, t] : inputs_) {
        const nvinfer1::Dims low = engine_->getProfileShape(name.c_str(), p, nvinfer1::OptProfileSelector::kMIN);
        const nvinfer1::Dims high = engine_->getProfileShape(name.c_str(), p, nvinfer1::OptProfileSelector::kMAX);
        if (low.nbDims < 0) continue;  // not shape-dependent in this engine
        fits = fits && low.nbDims == int32_t(t.shape.size());
        for (size_t i = 0; fits && i < t.shape.size(); ++i) fits = low.d[i] <= t.shape[i] && t.shape[i] <= high.d[i];
      }
      if (fits) return p;
    }
    return -1;
  }
  std::string shapes() const {
    std::string out;
    for (const auto& [name, t] : inputs_) out += (out.empty() ? "" : ", ") + name + " " + shape_text(t.shape);
    return out;
  }

  nvinfer1::ICudaEngine* engine_;
  CudaDevice& device_;
  Logger& logger_;
  std::string path_;
  std::vector<std::string> names_;
  std::vector<nvinfer1::IExecutionContext*> contexts_;  // one per optimization profile
  std::map<std::string, TensorRef> inputs_;
  std::map<std::string, void*> outputs_;
  std::map<std::string, Buffer> scratch_;
  bool graphed_;
  std::vector<int64_t> first_shape_;  // the first input bound since clear: [rows, tokens, ...]
  FirstRuns first_runs_;              // decode-sized binding keys run once
  std::map<std::string, CUgraphExec> graphs_;  // null: eager (not capturable, or past kGraphsKept)
  size_t captured_ = 0;
};

}  // namespace

TrtBackend::TrtBackend(const std::string& library_path, const std::string& driver_path, bool cuda_graphs)
    : device_(std::make_unique<CudaDevice>(driver_path, kWhy)), cuda_graphs_(cuda_graphs) {
  library_ = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library_) {
    const char* why = dlerror();
    throw Error(std::string(kWhy) + ": cannot load TensorRT from " + library_path + " (" + (why ? why : "unknown") +
                "): install TensorRT " + std::to_string(NV_TENSORRT_MAJOR) + ".x");
  }
  using Create = void* (*)(void*, int32_t);
  auto create = reinterpret_cast<Create>(symbol(library_, "createInferRuntime_INTERNAL", library_path));
  runtime_ = static_cast<nvinfer1::IRuntime*>(create(&logger_, NV_TENSORRT_VERSION));
  if (!runtime_)
    throw Error(std::string(kWhy) + ": " + library_path + " refused to create a runtime for TensorRT " +
                std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + " headers: " +
                logger_.last_error());
  using Version = int32_t (*)();
  const int32_t v = reinterpret_cast<Version>(symbol(library_, "getInferLibVersion", library_path))();
  version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

TrtBackend::~TrtBackend() { delete runtime_; }

std::unique_ptr<Graph> TrtBackend::open(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(std::string(kWhy) + ": cannot read " + path);
  const std::vector<char> blob((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  nvinfer1::ICudaEngine* engine = runtime_->deserializeCudaEngine(blob.data(), blob.size());
  if (!engine)
    throw Error("TensorRT: cannot load " + path + " (built for another GPU or TensorRT version?): " +
                logger_.last_error());
  return std::make_unique<TrtGraph>(engine, *device_, logger_, path, cuda_graphs_);
}

}  // namespace dflash::trt
