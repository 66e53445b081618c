// dflash::BlockAttention v1 TensorRT plugin: attributes, shape rules, and the call into the CUDA
// launcher. Every method is noexcept and reports through the TensorRT logger.
#include "block_attention/block_attention_plugin.h"

#include <cmath>

#include "block_attention/block_attention_kernel.h"
#include "tensorrt/plugin_common.h"

namespace dflash::trt {
namespace {

using nvinfer1::Dims;

constexpr int32_t kInputs = BlockAttentionPlugin::kNbInputs;
constexpr int32_t kOutputs = BlockAttentionPlugin::kNbOutputs;

BlockAttentionShape shape_of(const Dims* in) {
  // q [b, heads, n, d], k_context [b, kv, C, d]
  return {in[0].d[0], in[0].d[1], in[1].d[1], in[0].d[2], in[1].d[2], in[0].d[3]};
}

}  // namespace

std::string parse_block_attention_attributes(const nvinfer1::PluginFieldCollection* fc, BlockAttentionAttributes* out) {
  float scale = 0.f;
  int64_t causal = 0, window = 0;
  std::string error;
  if (!read_float_field(fc, "scale", &scale, &error) || !read_int_field(fc, "causal", &causal, &error) ||
      !read_int_field(fc, "window", &window, &error))
    return error;
  if (!std::isfinite(scale)) return "scale must be finite, got " + std::to_string(scale);
  if (causal != 0 && causal != 1) return "causal must be 0 or 1, got " + std::to_string(causal);
  if (window < 0 || window > INT32_MAX) return "window must be >= 0 (0: none), got " + std::to_string(window);
  *out = {scale, static_cast<int32_t>(causal), static_cast<int32_t>(window)};
  return "";
}

bool block_attention_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, nvinfer1::DimsExprs* outputs,
                                   int32_t nb_outputs) {
  if (nb_inputs != kInputs || nb_outputs != kOutputs || inputs[0].nbDims != 4) return false;
  outputs[0] = inputs[0];
  return true;
}

std::string check_block_attention_dims(const Dims* in, int32_t nb_inputs) {
  if (nb_inputs != kInputs) return "expects 6 inputs (q, k_context, v_context, k_block, v_block, context_lengths)";
  const Dims &q = in[0], &kc = in[1], &vc = in[2], &kb = in[3], &vb = in[4], &lengths = in[5];
  if (q.nbDims != 4 || kc.nbDims != 4 || vc.nbDims != 4 || kb.nbDims != 4 || vb.nbDims != 4 || lengths.nbDims != 1)
    return "q, k_context, v_context, k_block and v_block must be rank 4, context_lengths rank 1";
  const int64_t b = q.d[0], heads = q.d[1], n = q.d[2], d = q.d[3], kv = kc.d[1];
  if (!dims_match(vc, kc) || !same_dim(kc.d[0], b) || !same_dim(kc.d[3], d))
    return "k_context and v_context must be [batch, kv_heads, context, head_dim] matching q " + to_string(q) +
           ", got " + to_string(kc) + " and " + to_string(vc);
  const Dims block{4, {b, kv, n, d}};
  if (!dims_match(kb, block) || !dims_match(vb, block))
    return "k_block and v_block must be [batch, kv_heads, block, head_dim] = " + to_string(block) + ", got " +
           to_string(kb) + " and " + to_string(vb);
  if (!same_dim(lengths.d[0], b)) return "context_lengths must be [batch], got " + to_string(lengths);
  if (kv == 0 || (heads >= 0 && kv > 0 && heads % kv != 0))
    return "heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" + std::to_string(kv) + ")";
  if (d == 0 || d > kBlockAttentionMaxHeadDim) return "head_dim must be in [1, 256], got " + std::to_string(d);
  return "";
}

std::string BlockAttentionPlugin::dims_error(const Dims* inputs, int32_t nb_inputs) const {
  return check_block_attention_dims(inputs, nb_inputs);
}

int32_t BlockAttentionPlugin::getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                                                 const nvinfer1::DataType* input_types,
                                                 int32_t nb_inputs) const noexcept {
  if (nb_inputs != kInputs || nb_outputs != kOutputs) return -1;
  output_types[0] = input_types[0];  // q's dtype
  return 0;
}

int32_t BlockAttentionPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                              const nvinfer1::DimsExprs*, int32_t, nvinfer1::DimsExprs* outputs,
                                              int32_t nb_outputs, nvinfer1::IExprBuilder&) noexcept {
  if (block_attention_output_shapes(inputs, nb_inputs, outputs, nb_outputs)) return 0;
  return fail("expects 6 inputs with q of rank 4, and 1 output");
}

size_t BlockAttentionPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                                              const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept {
  if (nb_inputs != kInputs) return 0;
  Dims max[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) max[i] = inputs[i].max;
  return block_attention_workspace_size(shape_of(max));  // covers every smaller shape
}

int32_t BlockAttentionPlugin::enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc*,
                                      const void* const* inputs, void* const* outputs, void* workspace,
                                      cudaStream_t stream) noexcept {
  DType dtype;
  if (!to_dtype(input_desc[0].type, &dtype)) return fail("enqueue: q is not float32, float16 or bfloat16");
  Dims dims[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) dims[i] = input_desc[i].dims;
  const cudaError_t status =
      block_attention_launch(shape_of(dims), dtype, inputs[0], inputs[1], inputs[2], inputs[3], inputs[4],
                             static_cast<const int64_t*>(inputs[5]), attributes_.scale, attributes_.causal != 0,
                             attributes_.window, workspace, outputs[0], stream);
  if (status == cudaSuccess) return 0;
  return fail("kernel launch failed: ", cudaGetErrorString(status));
}

}  // namespace dflash::trt
