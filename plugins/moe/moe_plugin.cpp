// dflash::MoE v1 TensorRT plugin: attributes, shape rules, and the call into the CUDA launcher. Every
// method is noexcept and reports through the TensorRT logger.
#include "moe/moe_plugin.h"

#include "moe/moe_kernel.h"
#include "tensorrt/plugin_common.h"

namespace dflash::trt {
namespace {

using nvinfer1::Dims;

constexpr int32_t kInputs = MoEPlugin::kNbInputs;
constexpr int32_t kOutputs = MoEPlugin::kNbOutputs;

MoEShape shape_of(const Dims* in, int32_t top_k) {
  // hidden [tokens, H], router_logits [tokens, E], gate_up [E, 2I, H]
  return {in[0].d[0], in[0].d[1], in[1].d[1], in[2].d[1] / 2, top_k};
}

}  // namespace

std::string parse_moe_attributes(const nvinfer1::PluginFieldCollection* fc, MoEAttributes* out) {
  int64_t top_k = 0, normalize = 0;
  std::string error;
  if (!read_int_field(fc, "top_k", &top_k, &error) || !read_int_field(fc, "normalize", &normalize, &error))
    return error;
  // The contract's bound is [1, experts], checked with the shapes; the kernel's own is known already.
  if (top_k < 1 || top_k > kMoEMaxTopK)
    return "top_k must be in [1, experts] and <= 32 (the CUDA kernel's limit), got " + std::to_string(top_k);
  if (normalize != 0 && normalize != 1) return "normalize must be 0 or 1, got " + std::to_string(normalize);
  *out = {static_cast<int32_t>(top_k), static_cast<int32_t>(normalize)};
  return "";
}

bool moe_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, nvinfer1::DimsExprs* outputs,
                       int32_t nb_outputs) {
  if (nb_inputs != kInputs || nb_outputs != kOutputs || inputs[0].nbDims != 2) return false;
  outputs[0] = inputs[0];
  return true;
}

std::string check_moe_dims(const Dims* in, int32_t nb_inputs, int32_t top_k) {
  if (nb_inputs != kInputs) return "expects 4 inputs (hidden, router_logits, gate_up, down)";
  const Dims &hidden = in[0], &logits = in[1], &gate_up = in[2], &down = in[3];
  if (hidden.nbDims != 2 || logits.nbDims != 2 || gate_up.nbDims != 3 || down.nbDims != 3)
    return "hidden and router_logits must be rank 2, gate_up and down rank 3";
  const int64_t tokens = hidden.d[0], h = hidden.d[1], experts = logits.d[1], rows = gate_up.d[1];
  if (!same_dim(logits.d[0], tokens))
    return "router_logits must be [tokens, experts] with hidden's tokens " + to_string(hidden) + ", got " +
           to_string(logits);
  if (rows >= 0 && rows % 2 != 0)
    return "gate_up must be [experts, 2 * inter, hidden] (gate rows, then up rows), got " + to_string(gate_up);
  const Dims want_gate_up{3, {experts, rows, h}};
  if (!dims_match(gate_up, want_gate_up))
    return "gate_up must be [experts, 2 * inter, hidden] = " + to_string(want_gate_up) + ", got " + to_string(gate_up);
  const Dims want_down{3, {experts < 0 ? gate_up.d[0] : experts, h, rows < 0 ? -1 : rows / 2}};
  if (!dims_match(down, want_down))
    return "down must be [experts, hidden, inter] = " + to_string(want_down) + ", got " + to_string(down);
  const int64_t e = experts >= 0 ? experts : gate_up.d[0] >= 0 ? gate_up.d[0] : down.d[0];
  if (e >= 0 && top_k > e)
    return "top_k must be in [1, experts] = [1, " + std::to_string(e) + "], got " + std::to_string(top_k);
  if (e > kMoEMaxExperts) return "experts must be <= 512 (the CUDA kernel's limit), got " + std::to_string(e);
  if (h == 0 || rows == 0) return "hidden and inter must be >= 1";
  return "";
}

std::string MoEPlugin::dims_error(const Dims* inputs, int32_t nb_inputs) const {
  return check_moe_dims(inputs, nb_inputs, attributes_.top_k);
}

int32_t MoEPlugin::getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                                      const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept {
  if (nb_inputs != kInputs || nb_outputs != kOutputs) return -1;
  output_types[0] = input_types[0];  // hidden's dtype
  return 0;
}

int32_t MoEPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs*,
                                   int32_t, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                                   nvinfer1::IExprBuilder&) noexcept {
  if (moe_output_shapes(inputs, nb_inputs, outputs, nb_outputs)) return 0;
  return fail("expects 4 inputs with hidden of rank 2, and 1 output");
}

size_t MoEPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                                   const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept {
  if (nb_inputs != kInputs) return 0;
  Dims max[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) max[i] = inputs[i].max;
  return moe_workspace_size(shape_of(max, attributes_.top_k));  // covers every smaller shape
}

int32_t MoEPlugin::enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc*,
                           const void* const* inputs, void* const* outputs, void* workspace,
                           cudaStream_t stream) noexcept {
  DType dtype;
  if (!to_dtype(input_desc[0].type, &dtype)) return fail("enqueue: hidden is not float32, float16 or bfloat16");
  Dims dims[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) dims[i] = input_desc[i].dims;
  const MoEShape shape = shape_of(dims, attributes_.top_k);
  if (const char* why = moe_unsupported(shape)) return fail("enqueue: ", why);
  const cudaError_t status = moe_launch(shape, dtype, attributes_.normalize != 0, inputs[0], inputs[1], inputs[2],
                                        inputs[3], workspace, outputs[0], stream);
  if (status == cudaSuccess) return 0;
  return fail("kernel launch failed: ", cudaGetErrorString(status));
}

}  // namespace dflash::trt
