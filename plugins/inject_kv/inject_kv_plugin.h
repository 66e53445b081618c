// dflash::InjectKV v1 as a TensorRT IPluginV3: a thin wrapper over inject_kv_launch (no math here).
// The plugin name is the ONNX op type, so TensorRT's ONNX parser picks it for `dflash::InjectKV`
// nodes. Contract: plugins/inject_kv/README.md.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

namespace dflash::trt {

constexpr char kInjectKVName[] = "InjectKV";
constexpr char kInjectKVVersion[] = "1";

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

class InjectKVPlugin : public nvinfer1::IPluginV3,
                       public nvinfer1::IPluginV3OneCore,
                       public nvinfer1::IPluginV3OneBuild,
                       public nvinfer1::IPluginV3OneRuntime {
 public:
  explicit InjectKVPlugin(const InjectKVAttributes& attributes) : attributes_(attributes) {}
  const InjectKVAttributes& attributes() const { return attributes_; }

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;
  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return kInjectKVName; }
  const char* getPluginVersion() const noexcept override { return kInjectKVVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return 2; }
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
  InjectKVAttributes attributes_;
  nvinfer1::PluginField serialized_[2];  // points into attributes_
  nvinfer1::PluginFieldCollection serialized_collection_{};
};

class InjectKVCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  InjectKVCreator() noexcept;
  const char* getPluginName() const noexcept override { return kInjectKVName; }
  const char* getPluginVersion() const noexcept override { return kInjectKVVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_names_; }
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;

 private:
  nvinfer1::PluginField fields_[2];
  nvinfer1::PluginFieldCollection field_names_{};
};

}  // namespace dflash::trt
