// dflash::GatedDeltaRule v1 as a TensorRT IPluginV3: a thin wrapper over gated_delta_rule_launch (no
// math here); PluginBase holds the IPluginV3 boilerplate. The plugin name is the ONNX op type, so
// TensorRT's ONNX parser picks it for `dflash::GatedDeltaRule` nodes. `states_from` arrives as a
// shape input (the node's tensorrt_plugin_shape_input_indices = [6]), so the `states` output has
// its exact contract shape [b, s - states_from, Hv, Dk, Dv]. Contract: plugins/gated_delta_rule/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <array>
#include <cstdint>
#include <string>

#include "tensorrt/plugin_base.h"

namespace dflash::trt {

struct GatedDeltaRuleAttributes {};  // none: every size comes from the input shapes

// A node has no attributes to check; any fields it carries are ignored, as by the other ops (the
// ONNX parser itself reads tensorrt_plugin_shape_input_indices).
std::string parse_gated_delta_rule_attributes(const nvinfer1::PluginFieldCollection* fc, GatedDeltaRuleAttributes* out);

// out [b, s, Hv, Dv] (value's dims) and states [b, s - states_from, Hv, Dk, Dv], from the six
// tensor inputs and the one shape input (its value); false when they are not that.
bool gated_delta_rule_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                    const nvinfer1::DimsExprs* shape_inputs, int32_t nb_shape_inputs,
                                    nvinfer1::DimsExprs* outputs, int32_t nb_outputs, nvinfer1::IExprBuilder& builder);

// The six tensor inputs' dims against the contract, skipping dims TensorRT does not know yet (-1):
// "" or why not.
std::string check_gated_delta_rule_dims(const nvinfer1::Dims* inputs, int32_t nb_inputs);

// Runtime: the states rows TensorRT computed from states_from (s - states_from) must be in [1, s].
std::string check_gated_delta_rule_states(const nvinfer1::Dims& query, const nvinfer1::Dims& states);

class GatedDeltaRulePlugin : public PluginBase<GatedDeltaRulePlugin, GatedDeltaRuleAttributes> {
 public:
  static constexpr char kName[] = "GatedDeltaRule";
  static constexpr char kVersion[] = "1";
  // Tensor inputs query, key, value, g, beta, initial_state; shape input states_from; outputs out, states.
  static constexpr int32_t kNbInputs = 6;
  static constexpr int32_t kNbOutputs = 2;
  static constexpr uint32_t kInt64Inputs = 0;
  static constexpr uint32_t kFloat32Positions = 1u << 3 | 1u << 5 | 1u << 7;  // g, initial_state, states
  static constexpr char kWrongOutputCount[] = "expects 2 outputs";
  static constexpr std::array<AttributeField<GatedDeltaRuleAttributes>, 0> kFields{};
  using PluginBase::PluginBase;

  // The input check configurePlugin (build time) and onShapeChange (runtime) run: check_gated_delta_rule_dims.
  std::string dims_error(const nvinfer1::Dims* inputs, int32_t nb_inputs) const;

  // IPluginV3OneBuild
  // q, k, v, beta and out share one float dtype; g, initial_state and states are float32.
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs* shape_inputs,
                          int32_t nb_shape_inputs, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& builder) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nb_outputs) const noexcept override;
  // IPluginV3OneRuntime
  // The input check, and states_from (seen as the states rows) within [0, s - 1].
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nb_outputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
};

using GatedDeltaRuleCreator = CreatorBase<GatedDeltaRulePlugin, parse_gated_delta_rule_attributes>;

}  // namespace dflash::trt
