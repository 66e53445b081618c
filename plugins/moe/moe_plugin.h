// dflash::MoE v1 as a TensorRT IPluginV3: a thin wrapper over moe_launch (no math here); PluginBase
// holds the IPluginV3 boilerplate. The plugin name is the ONNX op type, so TensorRT's ONNX parser
// picks it for `dflash::MoE` nodes. Contract: plugins/moe/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

#include "tensorrt/plugin_base.h"

namespace dflash::trt {

struct MoEAttributes {
  int32_t top_k = 0;
  int32_t normalize = 0;  // 0 or 1
};

// The node's attributes (or the engine's serialized fields), checked; "" or why they are refused.
std::string parse_moe_attributes(const nvinfer1::PluginFieldCollection* fc, MoEAttributes* out);

// Output [tokens, H]: the dims of hidden (input 0).
bool moe_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, nvinfer1::DimsExprs* outputs,
                       int32_t nb_outputs);

// The four input dims against the contract and top_k, skipping dims TensorRT does not know yet (-1):
// "" or why not.
std::string check_moe_dims(const nvinfer1::Dims* inputs, int32_t nb_inputs, int32_t top_k);

class MoEPlugin : public PluginBase<MoEPlugin, MoEAttributes> {
 public:
  static constexpr char kName[] = "MoE";
  static constexpr char kVersion[] = "1";
  static constexpr int32_t kNbInputs = 4;  // hidden, router_logits, gate_up, down
  static constexpr int32_t kNbOutputs = 1;
  static constexpr uint32_t kInt64Inputs = 0;
  static constexpr char kWrongOutputCount[] = "expects 1 output";
  static constexpr AttributeField<MoEAttributes> kFields[] = {{"top_k", &MoEAttributes::top_k},
                                                              {"normalize", &MoEAttributes::normalize}};
  using PluginBase::PluginBase;

  // The input check configurePlugin (build time) and onShapeChange (runtime) run: check_moe_dims.
  std::string dims_error(const nvinfer1::Dims* inputs, int32_t nb_inputs) const;

  // IPluginV3OneBuild
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs* shape_inputs,
                          int32_t nb_shape_inputs, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& builder) noexcept override;
  // The scratch of the grouped kernels (moe_workspace_size) at the profile's largest shape.
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nb_outputs) const noexcept override;
  // IPluginV3OneRuntime
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
};

using MoECreator = CreatorBase<MoEPlugin, parse_moe_attributes>;

}  // namespace dflash::trt
