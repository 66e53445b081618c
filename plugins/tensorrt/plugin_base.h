// The IPluginV3 boilerplate every dflash op shares, so an op's plugin file holds only what differs:
// attributes, output types and shapes, workspace, shape checks and the launch.
//
//   class FooPlugin : public PluginBase<FooPlugin, FooAttributes> {
//    public:
//     static constexpr char kName[] = "Foo";            // the ONNX op type (namespace "")
//     static constexpr char kVersion[] = "1";           // the op contract's version
//     static constexpr int32_t kNbInputs = 3, kNbOutputs = 1;
//     static constexpr uint32_t kInt64Inputs = 0;       // format rule: see format_combination_ok
//     static constexpr char kWrongOutputCount[] = "expects 1 output";
//     static constexpr AttributeField<FooAttributes> kFields[] = {{"alpha", &FooAttributes::alpha}};
//     (an op without attributes: static constexpr std::array<AttributeField<FooAttributes>, 0> kFields{};)
//     using PluginBase::PluginBase;
//     std::string dims_error(const nvinfer1::Dims* inputs, int32_t nb_inputs) const;  // "" or why not
//     ... getOutputDataTypes, getOutputShapes, getWorkspaceSize, enqueue
//   };
//   using FooCreator = CreatorBase<FooPlugin, parse_foo_attributes>;
//
// kFields is both the creator's declared field names and the engine's serialized fields: the same
// names and types as the ONNX attributes, so createPlugin reads a node's attributes and an engine's
// fields alike. Every method is noexcept and reports through the TensorRT logger.
#pragma once

#include <NvInferRuntime.h>

#include <array>
#include <cstdint>
#include <iterator>
#include <new>
#include <string>

#include "tensorrt/plugin_common.h"

namespace dflash::trt {

// One attribute: its name, and the int32 or float member of Attributes that holds it (which fixes
// its field type).
template <typename Attributes>
class AttributeField {
 public:
  constexpr AttributeField(const char* name, int32_t Attributes::*member) : name_(name), int_(member) {}
  constexpr AttributeField(const char* name, float Attributes::*member) : name_(name), float_(member) {}

  // The creator's declaration: name and type, no data.
  nvinfer1::PluginField declaration() const noexcept { return {name_, nullptr, type(), 1}; }
  // The serialized field, pointing into `attributes`.
  nvinfer1::PluginField pointing_into(const Attributes& attributes) const noexcept {
    return {name_, int_ ? static_cast<const void*>(&(attributes.*int_)) : &(attributes.*float_), type(), 1};
  }

 private:
  nvinfer1::PluginFieldType type() const noexcept {
    return int_ ? nvinfer1::PluginFieldType::kINT32 : nvinfer1::PluginFieldType::kFLOAT32;
  }
  const char* name_;
  int32_t Attributes::*int_ = nullptr;
  float Attributes::*float_ = nullptr;
};

template <typename Derived, typename AttributesT>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  using Attributes = AttributesT;
  explicit PluginBase(const Attributes& attributes) : attributes_(attributes) {}
  const Attributes& attributes() const { return attributes_; }

  // Logs "dflash::<kName>: <what><detail>" through TensorRT's logger; returns TensorRT's failure status.
  static int32_t fail(const char* what, const char* detail = "") noexcept {
    return log_op_error(Derived::kName, what, detail);
  }
  static int32_t fail(const std::string& what) noexcept { return fail(what.c_str()); }

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE:
        return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD:
        return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME:
        return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }
  nvinfer1::IPluginV3* clone() noexcept override {
    return new (std::nothrow) Derived(static_cast<const Derived&>(*this));
  }
  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return Derived::kName; }
  const char* getPluginVersion() const noexcept override { return Derived::kVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return Derived::kNbOutputs; }
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override {
    return nb_inputs == Derived::kNbInputs && nb_outputs == Derived::kNbOutputs &&
           format_combination_ok(pos, in_out, nb_inputs + nb_outputs, Derived::kInt64Inputs);
  }
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc*, int32_t nb_outputs) noexcept override {
    if (nb_outputs != Derived::kNbOutputs) return fail(Derived::kWrongOutputCount);
    // Build time: dims TensorRT leaves to runtime are -1 and are checked again in onShapeChange.
    return check_inputs(in, nb_inputs);
  }
  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc*,
                        int32_t) noexcept override {
    return check_inputs(in, nb_inputs);
  }
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override {
    return clone();  // no per-context resources: the workspace comes from TensorRT
  }
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override {
    static_assert(std::size(Derived::kFields) <= kMaxFields, "raise PluginBase::kMaxFields");
    constexpr auto count = static_cast<int32_t>(std::size(Derived::kFields));
    for (int32_t i = 0; i < count; ++i) serialized_[i] = Derived::kFields[i].pointing_into(attributes_);
    serialized_collection_ = {count, serialized_};
    return &serialized_collection_;
  }

 protected:
  Attributes attributes_;

 private:
  // Derived::dims_error over the input dims of `in` (build-time or runtime descriptors), logged;
  // TensorRT's status.
  template <typename Desc>
  int32_t check_inputs(const Desc* in, int32_t nb_inputs) const noexcept {
    try {
      nvinfer1::Dims dims[Derived::kNbInputs];
      for (int32_t i = 0; i < Derived::kNbInputs && i < nb_inputs; ++i) dims[i] = dims_of(in[i]);
      const std::string error = static_cast<const Derived&>(*this).dims_error(dims, nb_inputs);
      return error.empty() ? 0 : fail(error);
    } catch (...) {
      return fail("out of memory while checking shapes");
    }
  }

  static const nvinfer1::Dims& dims_of(const nvinfer1::DynamicPluginTensorDesc& t) { return t.desc.dims; }
  static const nvinfer1::Dims& dims_of(const nvinfer1::PluginTensorDesc& t) { return t.dims; }

  static constexpr size_t kMaxFields = 8;
  nvinfer1::PluginField serialized_[kMaxFields];  // points into attributes_
  nvinfer1::PluginFieldCollection serialized_collection_{};
};

// The creator of Plugin: declares Plugin::kFields, and builds a plugin from a node's attributes or
// an engine's fields, checked by Parse ("" or why they are refused).
template <typename Plugin,
          std::string (*Parse)(const nvinfer1::PluginFieldCollection*, typename Plugin::Attributes*)>
class CreatorBase : public nvinfer1::IPluginCreatorV3One {
 public:
  CreatorBase() noexcept {
    for (size_t i = 0; i < std::size(Plugin::kFields); ++i) fields_[i] = Plugin::kFields[i].declaration();
  }
  const char* getPluginName() const noexcept override { return Plugin::kName; }
  const char* getPluginVersion() const noexcept override { return Plugin::kVersion; }
  const char* getPluginNamespace() const noexcept override { return ""; }
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_names_; }
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase) noexcept override {
    try {
      typename Plugin::Attributes attributes;
      const std::string error = Parse(fc, &attributes);
      if (!error.empty()) {
        Plugin::fail(std::string("node '") + (name ? name : "") + "': " + error);
        return nullptr;
      }
      return new Plugin(attributes);
    } catch (...) {
      Plugin::fail("createPlugin: out of memory");
      return nullptr;
    }
  }

 private:
  std::array<nvinfer1::PluginField, std::size(Plugin::kFields)> fields_{};  // std::array: may be empty
  nvinfer1::PluginFieldCollection field_names_{static_cast<int32_t>(std::size(Plugin::kFields)), fields_.data()};
};

}  // namespace dflash::trt
