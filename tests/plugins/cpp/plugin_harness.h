// Plugins made as TensorRT makes them, for the per-op tests: from a node's attributes through the
// op's creator, and back from an engine's serialized fields; the attributes the creator declares,
// and those it refuses.
#pragma once

#include <NvInferRuntime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "captured_log.h"
#include "check.h"
#include "tensorrt/plugin_base.h"

// The plugin the creator builds for node `node` from `fc`, or null when it refuses them.
template <typename Plugin, auto Parse>
std::unique_ptr<Plugin> create(dflash::trt::CreatorBase<Plugin, Parse>& creator, const char* node,
                               const nvinfer1::PluginFieldCollection& fc,
                               nvinfer1::TensorRTPhase phase = nvinfer1::TensorRTPhase::kBUILD) {
  return std::unique_ptr<Plugin>(static_cast<Plugin*>(creator.createPlugin(node, &fc, phase)));
}

// `built` after a trip through an engine: its getFieldsToSerialize, read back by the creator at runtime.
template <typename Plugin, auto Parse>
std::unique_ptr<Plugin> reload(dflash::trt::CreatorBase<Plugin, Parse>& creator, const char* node, Plugin& built) {
  auto* runtime = static_cast<nvinfer1::IPluginV3OneRuntime*>(
      built.getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME));
  return create(creator, node, *runtime->getFieldsToSerialize(), nvinfer1::TensorRTPhase::kRUNTIME);
}

// The creator declares exactly these attribute names and types, in this order.
template <typename Plugin, auto Parse>
void check_declared(dflash::trt::CreatorBase<Plugin, Parse>& creator,
                    const std::vector<std::pair<std::string, nvinfer1::PluginFieldType>>& expected) {
  const nvinfer1::PluginFieldCollection* names = creator.getFieldNames();
  CHECK_EQ(names->nbFields, static_cast<int32_t>(expected.size()));
  for (int32_t i = 0; i < names->nbFields && i < static_cast<int32_t>(expected.size()); ++i) {
    CHECK_EQ(std::string(names->fields[i].name), expected[i].first);
    CHECK(names->fields[i].type == expected[i].second);
  }
}

// Attributes the creator must refuse, and the end of the line it must log for them.
struct RefusedAttributes {
  std::vector<nvinfer1::PluginField> fields;
  const char* message;
};

// Each case gives no plugin and logs `prefix` + its message.
template <typename Plugin, auto Parse>
void check_refused(dflash::trt::CreatorBase<Plugin, Parse>& creator, const char* node, const std::string& prefix,
                   const std::vector<RefusedAttributes>& cases) {
  for (const RefusedAttributes& c : cases) {
    CapturedLog log;
    CHECK(create(creator, node, {static_cast<int32_t>(c.fields.size()), c.fields.data()}) == nullptr);
    CHECK(log.contains(prefix + c.message));
  }
}
