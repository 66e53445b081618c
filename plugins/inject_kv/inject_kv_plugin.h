// dflash::InjectKV v1 as a TensorRT IPluginV3: a thin wrapper over inject_kv_launch (no math here);
// PluginBase holds the IPluginV3 boilerplate. The plugin name is the ONNX op type, so TensorRT's
// ONNX parser picks it for `dflash::InjectKV` nodes. Contract: plugins/inject_kv/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

#include "tensorrt/plugin_base.h"

namespace dflash::trt {

struct InjectKVAttributes {
  int32_t num_kv_heads = 0;
  float epsilon = 0.f;
};

// The node's attributes (or the engine's serialized fields), checked; "" or why they are refused.
std::string parse_inject_kv_attributes(const nvinfer1::PluginFieldCollection* fc, InjectKVAttributes* out);

// Outputs k and v [b, kv, n, d] from hidden [b, n, H] (input 0) and cos [b, n, d] (input 4).
bool inject_kv_output_shapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, int32_t num_kv_heads,
                             nvinfer1::IExprBuilder& builder, nvinfer1::DimsExprs* outputs, int32_t nb_outputs);

// The six input dims against the contract, skipping dims TensorRT does not know yet (-1): "" or why not.
std::string check_inject_kv_dims(const nvinfer1::Dims* inputs, int32_t nb_inputs, int32_t num_kv_heads);

class InjectKVPlugin : public PluginBase<InjectKVPlugin, InjectKVAttributes> {
 public:
  static constexpr char kName[] = "InjectKV";
  static constexpr char kVersion[] = "1";
  static constexpr int32_t kNbInputs = 6;  // hidden, k_weight, v_weight, k_norm, cos, sin
  static constexpr int32_t kNbOutputs = 2;  // k, v
  static constexpr uint32_t kInt64Inputs = 0;
  static constexpr char kWrongOutputCount[] = "expects 2 outputs (k, v)";
  static constexpr AttributeField<InjectKVAttributes> kFields[] = {{"num_kv_heads", &InjectKVAttributes::num_kv_heads},
                                                                   {"epsilon", &InjectKVAttributes::epsilon}};
  using PluginBase::PluginBase;

  // The input check configurePlugin (build time) and onShapeChange (runtime) run: check_inject_kv_dims
  // with this node's num_kv_heads.
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

using InjectKVCreator = CreatorBase<InjectKVPlugin, parse_inject_kv_attributes>;

}  // namespace dflash::trt
