// dflash::BlockAttention v1 as a TensorRT IPluginV3: a thin wrapper over block_attention_launch (no
// math here). The plugin name is the ONNX op type, so TensorRT's ONNX parser picks it for
// `dflash::BlockAttention` nodes. Contract: plugins/block_attention/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

namespace dflash::trt {

constexpr char kBlockAttentionName[] = "BlockAttention";
constexpr char kBlockAttentionVersion[] = "1";

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

class BlockAttentionPlugin : public nvinfer1::IPluginV3,
                             public nvinfer1::IPluginV3OneCore,
                             public nvinfer1::IPluginV3OneBuild,
                             public nvinfer1::IPluginV3OneRuntime {
 public:
  explicit BlockAttentionPlugin(const BlockAttentionAttributes& attributes) : attributes_(attributes) {}
  const BlockAttentionAttributes& attributes() const { return attributes_; }

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;
  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return kBlockAttentionName; }
  const char* getPluginVersion() const noexcept override { return kBlockAttentionVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return 1; }
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs* shape_inputs,
                          int32_t nb_shape_inputs, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& builder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override;
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nb_outputs) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nb_outputs) const noexcept override;
  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nb_outputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 private:
  BlockAttentionAttributes attributes_;
  nvinfer1::PluginField serialized_[3];  // points into attributes_
  nvinfer1::PluginFieldCollection serialized_collection_{};
};

class BlockAttentionCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  BlockAttentionCreator() noexcept;
  const char* getPluginName() const noexcept override { return kBlockAttentionName; }
  const char* getPluginVersion() const noexcept override { return kBlockAttentionVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_names_; }
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;

 private:
  nvinfer1::PluginField fields_[3];
  nvinfer1::PluginFieldCollection field_names_{};
};

}  // namespace dflash::trt
