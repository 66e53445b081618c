// Entry points of libdflash_trt_plugins.so, the dflash TensorRT plugin library. TensorRT loads it
// with IPluginRegistry::loadLibrary (Python: registry.load_library, trtexec: --dynamicPlugins),
// calls setLoggerFinder, then registers what getCreators returns. These entry points are why the
// library needs no libnvinfer at link time (REGISTER_TENSORRT_PLUGIN would call into it).
#include <NvInferRuntime.h>

#include "block_attention/block_attention_plugin.h"
#include "gated_delta_rule/gated_delta_rule_plugin.h"
#include "inject_kv/inject_kv_plugin.h"
#include "moe/moe_plugin.h"
#include "tensorrt/plugin_common.h"

#define DFLASH_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

dflash::trt::InjectKVCreator g_inject_kv;
dflash::trt::BlockAttentionCreator g_block_attention;
dflash::trt::GatedDeltaRuleCreator g_gated_delta_rule;
dflash::trt::MoECreator g_moe;
nvinfer1::IPluginCreatorInterface* const g_creators[] = {&g_inject_kv, &g_block_attention, &g_gated_delta_rule,
                                                         &g_moe};

}  // namespace

DFLASH_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) { dflash::trt::set_logger_finder(finder); }

DFLASH_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& count) {
  count = static_cast<int32_t>(sizeof(g_creators) / sizeof(g_creators[0]));
  return g_creators;
}

// The op contract version (plugins/*/README.md headings), as the onnxruntime op library exports it:
// engine bundles record it and the runtime compares (dflash_trt/engines/build.py).
DFLASH_EXPORT int DflashOpsVersion() { return 1; }
