// The InjectKV plugin's host side: attributes in and out of an engine, refusals, output shapes,
// shape checks and the launch plan's workspace bound. The kernel itself is tested on a GPU
// (kernel_parity.cpp).
#include <cmath>
#include <memory>

#include "captured_log.h"
#include "check.h"
#include "inject_kv/inject_kv_kernel.h"
#include "inject_kv/inject_kv_plugin.h"
#include "mock_expr_builder.h"
#include "plugin_harness.h"

using dflash::trt::InjectKVCreator;
using dflash::trt::InjectKVPlugin;
using nvinfer1::Dims;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace {

constexpr char kNode[] = "layer0.inject";

// hidden [b, n, H], k_weight/v_weight [kv*d, H], k_norm [d], cos/sin [b, n, d]
std::vector<Dims> input_dims(int64_t b, int64_t n, int64_t h, int64_t kv, int64_t d) {
  return {Dims{3, {b, n, h}}, Dims{2, {kv * d, h}}, Dims{2, {kv * d, h}},
          Dims{1, {d}},       Dims{3, {b, n, d}},   Dims{3, {b, n, d}}};
}

}  // namespace

TEST(onnx_attributes_survive_serialization_into_an_engine) {
  InjectKVCreator creator;
  const int32_t kv = 4;
  const float epsilon = 1e-6f;
  const PluginField attrs[] = {{"num_kv_heads", &kv, PluginFieldType::kINT32, 1},
                               {"epsilon", &epsilon, PluginFieldType::kFLOAT32, 1}};
  auto built = create(creator, kNode, {2, attrs});
  CHECK(built != nullptr);
  if (!built) return;
  auto restored = reload(creator, kNode, *built);
  CHECK(restored != nullptr);
  if (!restored) return;
  CHECK_EQ(restored->attributes().num_kv_heads, 4);
  CHECK_EQ(restored->attributes().epsilon, 1e-6f);
  std::unique_ptr<nvinfer1::IPluginV3> copy(built->clone());
  CHECK_EQ(static_cast<InjectKVPlugin*>(copy.get())->attributes().num_kv_heads, 4);
}

TEST(the_creator_declares_the_onnx_attribute_names_and_types) {
  InjectKVCreator creator;
  check_declared(creator, {{"num_kv_heads", PluginFieldType::kINT32}, {"epsilon", PluginFieldType::kFLOAT32}});
}

TEST(the_plugin_exposes_core_build_and_runtime_interfaces) {
  InjectKVPlugin plugin({2, 1e-5f});
  auto* core =
      static_cast<nvinfer1::IPluginV3OneCore*>(plugin.getCapabilityInterface(nvinfer1::PluginCapabilityType::kCORE));
  CHECK_EQ(std::string(core->getPluginName()), std::string("InjectKV"));
  CHECK_EQ(std::string(core->getInterfaceInfo().kind), std::string("PLUGIN_V3ONE_CORE"));
  auto* build = plugin.getCapabilityInterface(nvinfer1::PluginCapabilityType::kBUILD);
  CHECK_EQ(std::string(build->getInterfaceInfo().kind), std::string("PLUGIN_V3ONE_BUILD"));
  auto* runtime = plugin.getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME);
  CHECK_EQ(std::string(runtime->getInterfaceInfo().kind), std::string("PLUGIN_V3ONE_RUNTIME"));
}

TEST(bad_attributes_are_refused_with_one_logged_line) {
  InjectKVCreator creator;
  const int32_t kv = 2, zero = 0;
  const int64_t kv64 = 2;
  const float epsilon = 1e-6f, nan = std::nanf(""), negative = -1.f;
  check_refused(creator, kNode, "dflash::InjectKV: node 'layer0.inject': ", {
      {{{"num_kv_heads", &kv, PluginFieldType::kINT32, 1}}, "missing attribute 'epsilon'"},
      {{{"num_kv_heads", &zero, PluginFieldType::kINT32, 1}, {"epsilon", &epsilon, PluginFieldType::kFLOAT32, 1}},
       "num_kv_heads must be >= 1, got 0"},
      {{{"num_kv_heads", &epsilon, PluginFieldType::kFLOAT32, 1}, {"epsilon", &epsilon, PluginFieldType::kFLOAT32, 1}},
       "attribute 'num_kv_heads' must be an integer"},
      {{{"num_kv_heads", &kv64, PluginFieldType::kINT64, 1}, {"epsilon", &nan, PluginFieldType::kFLOAT32, 1}},
       "epsilon must be finite and >= 0"},
      {{{"num_kv_heads", &kv, PluginFieldType::kINT32, 1}, {"epsilon", &negative, PluginFieldType::kFLOAT32, 1}},
       "epsilon must be finite and >= 0"},
  });
}

TEST(outputs_are_k_and_v_of_shape_batch_kv_tokens_head_dim_in_hiddens_dtype) {
  InjectKVPlugin plugin({8, 1e-6f});
  MockExprBuilder builder;
  const nvinfer1::DimsExprs inputs[] = {builder.dims({"b", "n", "4096"}), builder.dims({"1024", "4096"}),
                                        builder.dims({"1024", "4096"}),   builder.dims({"128"}),
                                        builder.dims({"b", "n", "128"}),  builder.dims({"b", "n", "128"})};
  nvinfer1::DimsExprs outputs[2];
  CHECK_EQ(plugin.getOutputShapes(inputs, 6, nullptr, 0, outputs, 2, builder), 0);
  for (const auto& out : outputs) {
    CHECK_EQ(out.nbDims, 4);
    CHECK_EQ(text_of(out.d[0]) + " " + text_of(out.d[1]) + " " + text_of(out.d[2]) + " " + text_of(out.d[3]),
             std::string("b 8 n 128"));
    CHECK(out.d[1]->isConstant() && out.d[1]->getConstantValue() == 8);
  }
  nvinfer1::DataType types[2];
  const nvinfer1::DataType in_types[6] = {nvinfer1::DataType::kBF16, nvinfer1::DataType::kBF16,
                                          nvinfer1::DataType::kBF16, nvinfer1::DataType::kBF16,
                                          nvinfer1::DataType::kBF16, nvinfer1::DataType::kBF16};
  CHECK_EQ(plugin.getOutputDataTypes(types, 2, in_types, 6), 0);
  CHECK(types[0] == nvinfer1::DataType::kBF16 && types[1] == nvinfer1::DataType::kBF16);
}

TEST(output_shapes_refuse_wrong_ranks_and_counts) {
  InjectKVPlugin plugin({8, 1e-6f});
  MockExprBuilder builder;
  CapturedLog log;
  nvinfer1::DimsExprs inputs[6] = {builder.dims({"b", "4096"}),     builder.dims({"1024", "4096"}),
                                   builder.dims({"1024", "4096"}),  builder.dims({"128"}),
                                   builder.dims({"b", "n", "128"}), builder.dims({"b", "n", "128"})};
  nvinfer1::DimsExprs outputs[2];
  CHECK_EQ(plugin.getOutputShapes(inputs, 6, nullptr, 0, outputs, 2, builder), -1);
  inputs[0] = builder.dims({"b", "n", "4096"});
  CHECK_EQ(plugin.getOutputShapes(inputs, 5, nullptr, 0, outputs, 2, builder), -1);
  CHECK(log.contains("dflash::InjectKV: expects 6 inputs"));
}

TEST(input_dims_are_checked_against_the_contract) {
  const auto ok = input_dims(2, 16, 4096, 8, 128);
  CHECK_EQ(dflash::trt::check_inject_kv_dims(ok.data(), 6, 8), std::string(""));
  auto unknown = input_dims(-1, -1, 4096, 8, 128);  // build time: batch and tokens come at runtime
  CHECK_EQ(dflash::trt::check_inject_kv_dims(unknown.data(), 6, 8), std::string(""));
  CHECK(dflash::trt::check_inject_kv_dims(ok.data(), 6, 4).find("k_weight and v_weight must be") == 0);
  auto bad_cos = ok;
  bad_cos[4].d[1] = 15;
  CHECK(dflash::trt::check_inject_kv_dims(bad_cos.data(), 6, 8).find("cos and sin must be") == 0);
  auto bad_norm = ok;
  bad_norm[3].d[0] = 64;
  CHECK(dflash::trt::check_inject_kv_dims(bad_norm.data(), 6, 8).find("k_norm must be") == 0);
  const auto odd = input_dims(1, 1, 64, 1, 7);
  CHECK(dflash::trt::check_inject_kv_dims(odd.data(), 6, 1).find("head_dim must be even") == 0);
  const auto wide = input_dims(1, 1, 64, 1, 512);
  CHECK(dflash::trt::check_inject_kv_dims(wide.data(), 6, 1).find("head_dim must be even and in [2, 256]") == 0);
  CHECK(dflash::trt::check_inject_kv_dims(ok.data(), 5, 8).find("expects 6 inputs") == 0);
}

TEST(the_workspace_for_the_largest_shape_covers_every_smaller_one) {
  // What a launch uses (inject_kv_plan) never exceeds the reserved size, which grows with every dim.
  for (int64_t b : {1, 3, 8})
    for (int64_t n : {1, 16, 700, 5000})
      for (int64_t kv : {1, 8})
        for (int64_t d : {64, 128}) {
          const dflash::InjectKVShape s{b, n, 4096, kv, d};
          const dflash::InjectKVPlan plan = dflash::inject_kv_plan(s);
          const size_t used = static_cast<size_t>(plan.splits * plan.rows_per_launch * 2 * kv * d) * sizeof(float);
          CHECK(used <= dflash::inject_kv_workspace_size(s));
          CHECK(plan.splits >= 1 && plan.k_per_split * plan.splits >= s.hidden);
          for (const dflash::InjectKVShape& larger :
               {dflash::InjectKVShape{b + 1, n, 4096, kv, d}, dflash::InjectKVShape{b, n + 1, 4096, kv, d},
                dflash::InjectKVShape{b, n, 4096, kv + 1, d}, dflash::InjectKVShape{b, n, 4096, kv, d + 2}})
            CHECK(dflash::inject_kv_workspace_size(larger) >= dflash::inject_kv_workspace_size(s));
        }
}
