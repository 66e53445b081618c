// dflash::GatedDeltaRule v1 TensorRT plugin: shape rules and the call into the CUDA launcher. Every
// method is noexcept and reports through the TensorRT logger.
#include "gated_delta_rule/gated_delta_rule_plugin.h"

#include "gated_delta_rule/gated_delta_rule_kernel.h"
#include "tensorrt/plugin_common.h"

namespace dflash::trt {
namespace {

using nvinfer1::Dims;

constexpr int32_t kInputs = GatedDeltaRulePlugin::kNbInputs;
constexpr int32_t kOutputs = GatedDeltaRulePlugin::kNbOutputs;

GatedDeltaRuleShape shape_of(const Dims* in) {
  // query [b, s, Hk, Dk], value [b, s, Hv, Dv]
  return {in[0].d[0], in[0].d[1], in[0].d[2], in[2].d[2], in[0].d[3], in[2].d[3]};
}

}  // namespace

std::string parse_gated_delta_rule_attributes(const nvinfer1::PluginFieldCollection*, GatedDeltaRuleAttributes* out) {
  *out = {};
  return "";
}

bool gated_delta_rule_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                    const nvinfer1::DimsExprs* shape_inputs, int32_t nb_shape_inputs,
                                    nvinfer1::DimsExprs* outputs, int32_t nb_outputs, nvinfer1::IExprBuilder& builder) {
  if (nb_inputs != kInputs || nb_shape_inputs != 1 || nb_outputs != kOutputs || inputs[0].nbDims != 4 ||
      inputs[2].nbDims != 4 || shape_inputs[0].nbDims != 1)
    return false;
  const nvinfer1::DimsExprs &query = inputs[0], &value = inputs[2];
  const nvinfer1::IDimensionExpr* kept =
      builder.operation(nvinfer1::DimensionOperation::kSUB, *value.d[1], *shape_inputs[0].d[0]);
  if (kept == nullptr) return false;
  outputs[0] = value;
  outputs[1].nbDims = 5;
  outputs[1].d[0] = value.d[0];
  outputs[1].d[1] = kept;  // s - states_from
  outputs[1].d[2] = value.d[2];
  outputs[1].d[3] = query.d[3];
  outputs[1].d[4] = value.d[3];
  return true;
}

std::string check_gated_delta_rule_dims(const Dims* in, int32_t nb_inputs) {
  if (nb_inputs != kInputs)
    return "expects 6 tensor inputs (query, key, value, g, beta, initial_state) and states_from as a shape input "
           "(node attribute tensorrt_plugin_shape_input_indices = [6]), got " + std::to_string(nb_inputs) +
           " tensor inputs";
  const Dims &q = in[0], &k = in[1], &v = in[2], &g = in[3], &beta = in[4], &state = in[5];
  if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4 || g.nbDims != 3 || beta.nbDims != 3 || state.nbDims != 4)
    return "query, key, value and initial_state must be rank 4, g and beta rank 3";
  const int64_t b = q.d[0], s = q.d[1], hk = q.d[2], dk = q.d[3], hv = v.d[2], dv = v.d[3];
  if (!dims_match(k, q)) return "key must have query's shape " + to_string(q) + ", got " + to_string(k);
  if (!same_dim(v.d[0], b) || !same_dim(v.d[1], s))
    return "value must be [batch, tokens, value_heads, value_dim] matching query " + to_string(q) + ", got " +
           to_string(v);
  const Dims gate{3, {b, s, hv}};
  if (!dims_match(g, gate) || !dims_match(beta, gate))
    return "g and beta must be [batch, tokens, value_heads] = " + to_string(gate) + ", got " + to_string(g) + " and " +
           to_string(beta);
  const Dims initial{4, {b, hv, dk, dv}};
  if (!dims_match(state, initial))
    return "initial_state must be [batch, value_heads, key_dim, value_dim] = " + to_string(initial) + ", got " +
           to_string(state);
  if (s == 0) return "tokens must be >= 1";
  if (hk == 0 || (hv >= 0 && hk > 0 && hv % hk != 0))
    return "value_heads (" + std::to_string(hv) + ") must be a multiple of key_heads (" + std::to_string(hk) + ")";
  if (dk == 0 || dk > kGatedDeltaRuleMaxKeyDim) return "key_dim must be in [1, 256], got " + std::to_string(dk);
  if (dv == 0) return "value_dim must be >= 1";
  return "";
}

std::string check_gated_delta_rule_states(const Dims& query, const Dims& states) {
  const int64_t s = query.d[1], kept = states.nbDims == 5 ? states.d[1] : -1;
  if (kept < 1 || kept > s)
    return "states_from must be in [0, tokens - 1] = [0, " + std::to_string(s - 1) + "], got " +
           std::to_string(s - kept);
  return "";
}

std::string GatedDeltaRulePlugin::dims_error(const Dims* inputs, int32_t nb_inputs) const {
  return check_gated_delta_rule_dims(inputs, nb_inputs);
}

bool GatedDeltaRulePlugin::supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out,
                                                     int32_t nb_inputs, int32_t nb_outputs) noexcept {
  return nb_inputs == kInputs && nb_outputs == kOutputs &&
         format_combination_ok(pos, in_out, nb_inputs + nb_outputs, kInt64Inputs, kFloat32Positions);
}

int32_t GatedDeltaRulePlugin::getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                                                 const nvinfer1::DataType* input_types,
                                                 int32_t nb_inputs) const noexcept {
  if (nb_inputs != kInputs || nb_outputs != kOutputs) return -1;
  output_types[0] = input_types[2];  // value's dtype
  output_types[1] = nvinfer1::DataType::kFLOAT;
  return 0;
}

int32_t GatedDeltaRulePlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                              const nvinfer1::DimsExprs* shape_inputs, int32_t nb_shape_inputs,
                                              nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                                              nvinfer1::IExprBuilder& builder) noexcept {
  if (gated_delta_rule_output_shapes(inputs, nb_inputs, shape_inputs, nb_shape_inputs, outputs, nb_outputs, builder))
    return 0;
  return fail(
      "expects 6 tensor inputs with query and value of rank 4, states_from as one shape input (node attribute "
      "tensorrt_plugin_shape_input_indices = [6]), and 2 outputs");
}

size_t GatedDeltaRulePlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc*, int32_t,
                                              const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept {
  return 0;  // the state lives in registers
}

int32_t GatedDeltaRulePlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs,
                                            const nvinfer1::PluginTensorDesc* out, int32_t nb_outputs) noexcept {
  if (const int32_t status = PluginBase::onShapeChange(in, nb_inputs, out, nb_outputs)) return status;
  if (nb_outputs != kOutputs) return fail(kWrongOutputCount);
  try {
    const std::string error = check_gated_delta_rule_states(in[0].dims, out[1].dims);
    return error.empty() ? 0 : fail(error);
  } catch (...) {
    return fail("out of memory while checking shapes");
  }
}

int32_t GatedDeltaRulePlugin::enqueue(const nvinfer1::PluginTensorDesc* input_desc,
                                      const nvinfer1::PluginTensorDesc* output_desc, const void* const* inputs,
                                      void* const* outputs, void*, cudaStream_t stream) noexcept {
  DType dtype;
  if (!to_dtype(input_desc[0].type, &dtype)) return fail("enqueue: query is not float32, float16 or bfloat16");
  Dims dims[kInputs];
  for (int32_t i = 0; i < kInputs; ++i) dims[i] = input_desc[i].dims;
  const GatedDeltaRuleShape shape = shape_of(dims);
  // Shape inputs never reach enqueue: states_from is what the states rows (s - states_from) say.
  const int64_t states_from = shape.tokens - output_desc[1].dims.d[1];
  if (const char* why = gated_delta_rule_unsupported(shape, states_from)) return fail("enqueue: ", why);
  const cudaError_t status = gated_delta_rule_launch(
      shape, dtype, inputs[0], inputs[1], inputs[2], static_cast<const float*>(inputs[3]), inputs[4],
      static_cast<const float*>(inputs[5]), states_from, outputs[0], static_cast<float*>(outputs[1]), stream);
  if (status == cudaSuccess) return 0;
  return fail("kernel launch failed: ", cudaGetErrorString(status));
}

}  // namespace dflash::trt
