// dflash::InjectKV v1 TensorRT plugin: attributes, shape rules, and the call into the CUDA launcher.
// Every method is noexcept and reports through the TensorRT logger.
#include "inject_kv/inject_kv_plugin.h"

#include <cmath>

#include "inject_kv/inject_kv_kernel.h"
#include "tensorrt/plugin_common.h"

namespace dflash::trt {
namespace {

using nvinfer1::Dims;

constexpr int32_t kInputs = InjectKVPlugin::kNbInputs;
constexpr int32_t kOutputs = InjectKVPlugin::kNbOutputs;

InjectKVShape shape_of(const Dims* in, int32_t num_kv_heads) {
  return {in[0].d[0], in[0].d[1], in[0].d[2], num_kv_heads, in[4].d[2]};
}

}  // namespace

std::string parse_inject_kv_attributes(const nvinfer1::PluginFieldCollection* fc, InjectKVAttributes* out) {
  int64_t kv = 0;
  float epsilon = 0.f;
  std::string error;
  if (!read_int_field(fc, "num_kv_heads", &kv, &error) || !read_float_field(fc, "epsilon", &epsilon, &error))
    return error;
  if (kv < 1 || kv > INT32_MAX) return "num_kv_heads must be >= 1, got " + std::to_string(kv);
  if (!std::isfinite(epsilon) || epsilon < 0.f)
    return "epsilon must be finite and >= 0, got " + std::to_string(epsilon);
  *out = {static_cast<int32_t>(kv), epsilon};
  return "";
}

bool inject_kv_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, int32_t num_kv_heads,
                             nvinfer1::IExprBuilder& builder, nvinfer1::DimsExprs* outputs, int32_t nb_outputs) {
  if (nb_inputs != kInputs || nb_outputs != kOutputs || inputs[0].nbDims != 3 || inputs[4].nbDims != 3) return false;
  const nvinfer1::IDimensionExpr* kv = builder.constant(num_kv_heads);
  if (kv == nullptr) return false;
  for (int32_t i = 0; i < kOutputs; ++i) {
    outputs[i].nbDims = 4;
    outputs[i].d[0] = inputs[0].d[0];  // b
    outputs[i].d[1] = kv;
    outputs[i].d[2] = inputs[0].d[1];  // n
    outputs[i].d[3] = inputs[4].d[2];  // d, from cos
  }
  return true;
}

std::string check_inject_kv_dims(const Dims* in, int32_t nb_inputs, int32_t num_kv_heads) {
  if (nb_inputs != kInputs) return "expects 6 inputs (hidden, k_weight, v_weight, k_norm, cos, sin)";
  const Dims &hidden = in[0], &wk = in[1], &wv = in[2], &norm = in[3], &cos = in[4], &sin = in[5];
  if (hidden.nbDims != 3 || cos.nbDims != 3 || sin.nbDims != 3 || wk.nbDims != 2 || wv.nbDims != 2 || norm.nbDims != 1)
    return "hidden, cos and sin must be rank 3, k_weight and v_weight rank 2, k_norm rank 1";
  const int64_t d = cos.d[2], h = hidden.d[2];
  if (!dims_match(sin, cos) || !same_dim(cos.d[0], hidden.d[0]) || !same_dim(cos.d[1], hidden.d[1]))
    return "cos and sin must be [batch, tokens, head_dim] like hidden " + to_string(hidden) + ", got cos " +
           to_string(cos) + " and sin " + to_string(sin);
  const Dims weight{2, {d < 0 ? -1 : num_kv_heads * d, h}};
  if (!dims_match(wk, weight) || !dims_match(wv, weight))
    return "k_weight and v_weight must be [num_kv_heads * head_dim, hidden] = " + to_string(weight) + ", got " +
           to_string(wk) + " and " + to_string(wv);
  if (!same_dim(norm.d[0], d)) return "k_norm must be [head_dim] = [" + std::to_string(d) + "], got " + to_string(norm);
  if (d >= 0 && (d < 2 || d % 2 != 0 || d > kInjectKVMaxHeadDim))
    return "head_dim must be even and in [2, 256], got " + std::to_string(d);
  return "";
}

std::string InjectKVPlugin::dims_error(const Dims* inputs, int32_t nb_inputs) const {
  return check_inject_kv_dims(inputs, nb_inputs, attributes_.num_kv_heads);
}

int32_t InjectKVPlugin::getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                                           const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept {
  if (nb_inputs != kInputs || nb_outputs != kOutputs) return -1;
  output_types[0] = output_types[1] = input_types[0];  // k and v in hidden's dtype
  return 0;
}

int32_t InjectKVPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                        const nvinfer1::DimsExprs*, int32_t, nvinfer1::DimsExprs* outputs,
                                        int32_t nb_outputs, nvinfer1::IExprBuilder& builder) noexcept {
  if (inject_kv_output_shapes(inputs, nb_inputs, attributes_.num_kv_heads, builder, outputs, nb_outputs)) return 0;
  return fail("expects 6 inputs with hidden and cos of rank 3, and 2 outputs");
}

size_t InjectKVPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                                        const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept {
  if (nb_inputs != kInputs) return 0;
  Dims max[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) max[i] = inputs[i].max;
  return inject_kv_workspace_size(shape_of(max, attributes_.num_kv_heads));  // covers every smaller shape
}

int32_t InjectKVPlugin::enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc*,
                                const void* const* inputs, void* const* outputs, void* workspace,
                                cudaStream_t stream) noexcept {
  DType dtype;
  if (!to_dtype(input_desc[0].type, &dtype)) return fail("enqueue: hidden is not float32, float16 or bfloat16");
  Dims dims[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) dims[i] = input_desc[i].dims;
  const cudaError_t status =
      inject_kv_launch(shape_of(dims, attributes_.num_kv_heads), dtype, inputs[0], inputs[1], inputs[2], inputs[3],
                       inputs[4], inputs[5], attributes_.epsilon, workspace, outputs[0], outputs[1], stream);
  if (status == cudaSuccess) return 0;
  return fail("kernel launch failed: ", cudaGetErrorString(status));
}

}  // namespace dflash::trt
