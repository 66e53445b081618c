// The GatedDeltaRule plugin's host side: no attributes in or out of an engine, output shapes (states
// sized by the states_from shape input) and dtypes, the format rule (float32 state tensors beside a
// half-precision op), shape checks, the runtime states_from refusal and the kernel's limits. The
// kernel itself is tested on a GPU (kernel_parity.cpp).
#include <memory>
#include <vector>

#include "captured_log.h"
#include "check.h"
#include "gated_delta_rule/gated_delta_rule_kernel.h"
#include "gated_delta_rule/gated_delta_rule_plugin.h"
#include "mock_expr_builder.h"
#include "plugin_harness.h"

using dflash::trt::GatedDeltaRuleCreator;
using dflash::trt::GatedDeltaRulePlugin;
using nvinfer1::DataType;
using nvinfer1::Dims;

namespace {

constexpr char kNode[] = "layer0.linear_attn";

// The tensor inputs: query, key [b, s, Hk, Dk], value [b, s, Hv, Dv], g, beta [b, s, Hv], initial_state [b, Hv, Dk, Dv]
std::vector<Dims> input_dims(int64_t b, int64_t s, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  return {Dims{4, {b, s, hk, dk}}, Dims{4, {b, s, hk, dk}}, Dims{4, {b, s, hv, dv}},
          Dims{3, {b, s, hv}},     Dims{3, {b, s, hv}},     Dims{4, {b, hv, dk, dv}}};
}

std::string text_of_dims(const nvinfer1::DimsExprs& dims) {
  std::string text;
  for (int32_t i = 0; i < dims.nbDims; ++i) text += (i ? " " : "") + text_of(dims.d[i]);
  return text;
}

}  // namespace

TEST(a_node_without_attributes_makes_a_plugin_that_survives_an_engine) {
  GatedDeltaRuleCreator creator;
  check_declared(creator, {});
  auto built = create(creator, kNode, {0, nullptr});
  CHECK(built != nullptr);
  if (!built) return;
  auto restored = reload(creator, kNode, *built);
  CHECK(restored != nullptr);
  std::unique_ptr<nvinfer1::IPluginV3> copy(built->clone());
  CHECK(copy != nullptr);
  CHECK_EQ(built->getNbOutputs(), 2);
  CHECK_EQ(std::string(built->getPluginName()), std::string("GatedDeltaRule"));
}

TEST(out_has_values_shape_and_states_s_minus_states_from_positions) {
  GatedDeltaRulePlugin plugin(dflash::trt::GatedDeltaRuleAttributes{});
  MockExprBuilder builder;
  const nvinfer1::DimsExprs inputs[] = {builder.dims({"b", "s", "16", "128"}), builder.dims({"b", "s", "16", "128"}),
                                        builder.dims({"b", "s", "32", "128"}), builder.dims({"b", "s", "32"}),
                                        builder.dims({"b", "s", "32"}),        builder.dims({"b", "32", "128", "128"})};
  const nvinfer1::DimsExprs states_from[] = {builder.dims({"f"})};  // the shape input's value
  nvinfer1::DimsExprs out[2];
  CHECK_EQ(plugin.getOutputShapes(inputs, 6, states_from, 1, out, 2, builder), 0);
  CHECK_EQ(text_of_dims(out[0]), std::string("b s 32 128"));
  CHECK_EQ(text_of_dims(out[1]), std::string("b (s - f) 32 128 128"));
  DataType types[2];
  const DataType in_types[6] = {DataType::kBF16, DataType::kBF16, DataType::kBF16,
                                DataType::kFLOAT, DataType::kBF16, DataType::kFLOAT};
  CHECK_EQ(plugin.getOutputDataTypes(types, 2, in_types, 6), 0);
  CHECK(types[0] == DataType::kBF16);
  CHECK(types[1] == DataType::kFLOAT);
}

TEST(states_from_as_an_ordinary_input_is_refused_with_the_attribute_to_add) {
  // A node exported without tensorrt_plugin_shape_input_indices: the parser hands over 7 tensor inputs.
  GatedDeltaRulePlugin plugin(dflash::trt::GatedDeltaRuleAttributes{});
  MockExprBuilder builder;
  std::vector<nvinfer1::DimsExprs> inputs = {builder.dims({"b", "s", "1", "8"}), builder.dims({"b", "s", "1", "8"}),
                                             builder.dims({"b", "s", "2", "8"}), builder.dims({"b", "s", "2"}),
                                             builder.dims({"b", "s", "2"}),      builder.dims({"b", "2", "8", "8"}),
                                             builder.dims({})};
  nvinfer1::DimsExprs out[2];
  CapturedLog log;
  CHECK_EQ(plugin.getOutputShapes(inputs.data(), 7, nullptr, 0, out, 2, builder), -1);
  CHECK(log.contains("dflash::GatedDeltaRule: expects 6 tensor inputs"));
  CHECK(log.contains("tensorrt_plugin_shape_input_indices = [6]"));
  const auto seven = [] {
    auto dims = input_dims(1, 4, 1, 2, 8, 8);
    dims.push_back(Dims{0, {}});
    return dims;
  }();
  CHECK(dflash::trt::check_gated_delta_rule_dims(seven.data(), 7).find("tensorrt_plugin_shape_input_indices") !=
        std::string::npos);
}

TEST(states_from_outside_the_sequence_is_refused_when_shapes_are_known) {
  using dflash::trt::check_gated_delta_rule_states;
  const Dims query{4, {2, 16, 16, 128}};
  CHECK_EQ(check_gated_delta_rule_states(query, Dims{5, {2, 16, 32, 128, 128}}), std::string(""));  // states_from 0
  CHECK_EQ(check_gated_delta_rule_states(query, Dims{5, {2, 1, 32, 128, 128}}), std::string(""));   // 15
  CHECK_EQ(check_gated_delta_rule_states(query, Dims{5, {2, 0, 32, 128, 128}}),
           std::string("states_from must be in [0, tokens - 1] = [0, 15], got 16"));
  CHECK_EQ(check_gated_delta_rule_states(query, Dims{5, {2, 17, 32, 128, 128}}),
           std::string("states_from must be in [0, tokens - 1] = [0, 15], got -1"));
  GatedDeltaRulePlugin plugin(dflash::trt::GatedDeltaRuleAttributes{});
  const auto dims = input_dims(2, 16, 16, 32, 128, 128);
  nvinfer1::PluginTensorDesc in[6] = {}, out[2] = {};
  for (int i = 0; i < 6; ++i) in[i].dims = dims[i];
  out[0].dims = Dims{4, {2, 16, 32, 128}};
  out[1].dims = Dims{5, {2, 0, 32, 128, 128}};
  CapturedLog log;
  CHECK_EQ(plugin.onShapeChange(in, 6, out, 2), -1);
  CHECK(log.contains("dflash::GatedDeltaRule: states_from must be in [0, tokens - 1]"));
  out[1].dims.d[1] = 4;
  CHECK_EQ(plugin.onShapeChange(in, 6, out, 2), 0);
}

TEST(g_initial_state_and_states_are_float32_the_rest_one_float_dtype) {
  GatedDeltaRulePlugin plugin(dflash::trt::GatedDeltaRuleAttributes{});
  for (DataType f : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16}) {
    std::vector<nvinfer1::DynamicPluginTensorDesc> io(8);
    for (int i = 0; i < 8; ++i) {
      io[i].desc.type = (i == 3 || i == 5 || i == 7) ? DataType::kFLOAT : f;
      io[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
    }
    for (int pos = 0; pos < 8; ++pos) CHECK(plugin.supportsFormatCombination(pos, io.data(), 6, 2));
    const DataType other = f == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;
    for (int pos : {4, 6}) {  // beta and out follow query
      io[pos].desc.type = other;
      CHECK(!plugin.supportsFormatCombination(pos, io.data(), 6, 2));
      io[pos].desc.type = f;
    }
    for (int pos : {3, 5, 7}) {  // g, initial_state, states: float32 only
      io[pos].desc.type = DataType::kHALF;
      CHECK(!plugin.supportsFormatCombination(pos, io.data(), 6, 2));
      io[pos].desc.type = DataType::kFLOAT;
    }
  }
}

TEST(input_dims_are_checked_against_the_contract) {
  using dflash::trt::check_gated_delta_rule_dims;
  const auto ok = input_dims(2, 16, 16, 32, 128, 128);
  CHECK_EQ(check_gated_delta_rule_dims(ok.data(), 6), std::string(""));
  const auto unknown = input_dims(-1, -1, 16, 32, 128, 128);
  CHECK_EQ(check_gated_delta_rule_dims(unknown.data(), 6), std::string(""));
  const auto heads = input_dims(1, 4, 3, 4, 8, 8);
  CHECK(check_gated_delta_rule_dims(heads.data(), 6).find("must be a multiple of key_heads") != std::string::npos);
  const auto wide = input_dims(1, 4, 1, 1, 512, 8);
  CHECK(check_gated_delta_rule_dims(wide.data(), 6).find("key_dim must be in [1, 256]") == 0);
  const auto empty = input_dims(1, 0, 1, 1, 8, 8);
  CHECK_EQ(check_gated_delta_rule_dims(empty.data(), 6), std::string("tokens must be >= 1"));
  auto bad_key = ok;
  bad_key[1].d[3] = 64;
  CHECK(check_gated_delta_rule_dims(bad_key.data(), 6).find("key must have query's shape") == 0);
  auto bad_gate = ok;
  bad_gate[4].d[2] = 16;
  CHECK(check_gated_delta_rule_dims(bad_gate.data(), 6).find("g and beta must be") == 0);
  auto bad_state = ok;
  bad_state[5].d[3] = 64;
  CHECK(check_gated_delta_rule_dims(bad_state.data(), 6).find("initial_state must be") == 0);
}

TEST(the_kernel_states_its_limits) {
  CHECK(dflash::gated_delta_rule_unsupported({1, 16, 16, 32, 128, 128}, 0) == nullptr);
  CHECK(dflash::gated_delta_rule_unsupported({3, 1, 1, 1, 256, 7}, 0) == nullptr);
  CHECK(dflash::gated_delta_rule_unsupported({1, 16, 16, 32, 257, 128}, 0) != nullptr);
  CHECK(dflash::gated_delta_rule_unsupported({1, 0, 1, 1, 8, 8}, 0) != nullptr);
  CHECK(dflash::gated_delta_rule_unsupported({1, 4, 2, 3, 8, 8}, 0) != nullptr);
  CHECK_EQ(std::string(dflash::gated_delta_rule_unsupported({1, 4, 1, 1, 8, 8}, 4)),
           std::string("states_from must be in [0, tokens - 1]"));
  CHECK(dflash::gated_delta_rule_unsupported({1, 4, 1, 1, 8, 8}, -1) != nullptr);
  CHECK(dflash::gated_delta_rule_unsupported({1, 4, 1, 1, 8, 8}, 3) == nullptr);
}
