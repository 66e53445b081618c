// ort_executor.cpp: onnxruntime sessions as the slot executor's graphs.
#include "ort_executor.h"

#include <utility>
#include <vector>

namespace dflash {

namespace {

constexpr char kWhy[] = "the C++ onnxruntime executor";

ONNXTensorElementDataType element_type(DType t) {
  switch (t) {
    case DType::float32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DType::float16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DType::bfloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case DType::int64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  }
  DFLASH_INVARIANT(false);
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

// One session and its binding; the values wrapping bound memory live until the next clear.
class OrtGraph final : public Graph {
 public:
  OrtGraph(std::shared_ptr<ort::Runtime> runtime, ort::Session session)
      : runtime_(std::move(runtime)), session_(std::move(session)), binding_(runtime_->binding(session_)) {}

  void clear() override {
    runtime_->clear(binding_);
    values_.clear();
    step_shapes_.clear();
  }
  void input(const std::string& name, const TensorRef& t) override {
    runtime_->bind_input(binding_, name, value(t));
    if (t.shape.size() <= 2) step_shapes_ += name + shape_text(t.shape);
  }
  void output(const std::string& name, const TensorRef& t) override {
    runtime_->bind_output(binding_, name, value(t));
  }
  // onnxruntime plans each new set of input shapes on its first run. Keyed on the token and index
  // inputs' shapes (rank <= 2: [rows, tokens], [rows], [rows, logits rows]), which a phase's cost is
  // learnt by, not the caches' and contexts': the draft block pass's context grows a row each step on
  // the host, and a plan paid at every step is no set-up but the steady cost.
  bool run(const std::string& what) override {
    runtime_->run(session_, binding_, what);
    return first_runs_.first(step_shapes_);
  }

 private:
  // One OrtValue per distinct memory: an output bound to an input's memory gets the input's value,
  // which is how onnxruntime's kernels see that they may write in place.
  const ort::Value& value(const TensorRef& t) {
    for (const auto& [data, v] : values_)
      if (data == t.data) return v;
    values_.emplace_back(t.data, runtime_->tensor(t.data, element_type(t.dtype), dtype_size(t.dtype), t.shape));
    return values_.back().second;
  }

  std::shared_ptr<ort::Runtime> runtime_;
  ort::Session session_;
  ort::Binding binding_;
  std::vector<std::pair<void*, ort::Value>> values_;
  std::string step_shapes_;  // the token and index inputs' names and shapes, since clear
  FirstRuns first_runs_;
};

// The config is checked before the library loads: every refusal comes before any work.
std::unique_ptr<GraphBackend> checked_backend(const SlotExecutorConfig& config) {
  config.validate(kWhy);
  if (config.dtype == "bfloat16")
    throw Error(std::string(kWhy) + " runs float32 and float16 bundles (onnxruntime's CPU GroupQueryAttention " +
                "has no bfloat16 kernel): re-export with --dtype fp16 or fp32");
  return std::make_unique<OrtBackend>(config.library_path, config.threads);
}

}  // namespace

OrtBackend::OrtBackend(const std::string& library_path, int64_t threads)
    : runtime_(ort::Runtime::load(library_path)), threads_(threads) {}

std::unique_ptr<Graph> OrtBackend::open(const std::string& path) {
  return std::make_unique<OrtGraph>(runtime_, runtime_->open(path, threads_));
}

OrtExecutor::OrtExecutor(const SlotExecutorConfig& config) : SlotExecutor(config, checked_backend(config), kWhy) {}

}  // namespace dflash
