// dflash::BlockAttention v1 as a TensorRT IPluginV3: a thin wrapper over block_attention_launch (no
// math here); PluginBase holds the IPluginV3 boilerplate. The plugin name is the ONNX op type, so
// TensorRT's ONNX parser picks it for `dflash::BlockAttention` nodes. Contract: plugins/block_attention/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

#include "tensorrt/plugin_base.h"

namespace dflash::trt {

struct BlockAttentionAttributes {
  float scale = 0.f;
  int32_t causal = 0;  // 0 or 1
  int32_t window = 0;  // 0: no window
};

// The node's attributes (or the engine's serialized fields), checked; "" or why they are refused.
std::string parse_block_attention_attributes(const nvinfer1::PluginFieldCollection* fc, BlockAttentionAttributes* out);

// Output [b, heads, n, d]: the dims of q (input 0).
bool block_attention_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, nvinfer1::DimsExprs* outputs,
                                   int32_t nb_outputs);

// The six input dims against the contract, skipping dims TensorRT does not know yet (-1): "" or why not.
std::string check_block_attention_dims(const nvinfer1::Dims* inputs, int32_t nb_inputs);

class BlockAttentionPlugin : public PluginBase<BlockAttentionPlugin, BlockAttentionAttributes> {
 public:
  static constexpr char kName[] = "BlockAttention";
  static constexpr char kVersion[] = "1";
  static constexpr int32_t kNbInputs = 6;  // q, k_context, v_context, k_block, v_block, context_lengths
  static constexpr int32_t kNbOutputs = 1;
  static constexpr uint32_t kInt64Inputs = 1u << 5;  // context_lengths
  static constexpr char kWrongOutputCount[] = "expects 1 output";
  static constexpr AttributeField<BlockAttentionAttributes> kFields[] = {{"scale", &BlockAttentionAttributes::scale},
                                                                         {"causal", &BlockAttentionAttributes::causal},
                                                                         {"window", &BlockAttentionAttributes::window}};
  using PluginBase::PluginBase;

  // The input check configurePlugin (build time) and onShapeChange (runtime) run: check_block_attention_dims.
  std::string dims_error(const nvinfer1::Dims* inputs, int32_t nb_inputs) const;

  // IPluginV3OneBuild
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs* shape_inputs,
                          int32_t nb_shape_inputs, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& builder) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nb_outputs) const noexcept override;
  // IPluginV3OneRuntime
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
};

using BlockAttentionCreator = CreatorBase<BlockAttentionPlugin, parse_block_attention_attributes>;

}  // namespace dflash::trt
