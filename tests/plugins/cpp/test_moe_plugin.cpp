// The MoE plugin's host side: attributes in and out of an engine, refusals, output shape and dtype,
// the format rule, shape checks, the kernel's limits and the scratch bound. The kernel itself is
// tested on a GPU (kernel_parity.cpp).
#include <memory>
#include <vector>

#include "captured_log.h"
#include "check.h"
#include "mock_expr_builder.h"
#include "moe/moe_kernel.h"
#include "moe/moe_plugin.h"
#include "plugin_harness.h"

using dflash::trt::MoECreator;
using dflash::trt::MoEPlugin;
using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace {

constexpr char kNode[] = "layer7.mlp.experts";

// hidden [T, H], router_logits [T, E], gate_up [E, 2I, H], down [E, H, I]
std::vector<Dims> input_dims(int64_t t, int64_t h, int64_t e, int64_t i) {
  return {Dims{2, {t, h}}, Dims{2, {t, e}}, Dims{3, {e, i < 0 ? -1 : 2 * i, h}}, Dims{3, {e, h, i}}};
}

std::vector<PluginField> fields(const int32_t* top_k, const int32_t* normalize) {
  return {{"top_k", top_k, PluginFieldType::kINT32, 1}, {"normalize", normalize, PluginFieldType::kINT32, 1}};
}

}  // namespace

TEST(onnx_attributes_survive_serialization_into_an_engine) {
  MoECreator creator;
  const int32_t top_k = 8, normalize = 1;
  const auto attrs = fields(&top_k, &normalize);
  auto built = create(creator, kNode, {2, attrs.data()});
  CHECK(built != nullptr);
  if (!built) return;
  auto restored = reload(creator, kNode, *built);
  CHECK(restored != nullptr);
  if (!restored) return;
  CHECK_EQ(restored->attributes().top_k, 8);
  CHECK_EQ(restored->attributes().normalize, 1);
  std::unique_ptr<nvinfer1::IPluginV3> copy(built->clone());
  CHECK_EQ(static_cast<MoEPlugin*>(copy.get())->attributes().top_k, 8);
  CHECK_EQ(built->getNbOutputs(), 1);
  CHECK_EQ(std::string(built->getPluginName()), std::string("MoE"));
}

TEST(int64_attributes_as_the_onnx_parser_may_hand_them_are_taken) {
  MoECreator creator;
  const int64_t top_k = 2, normalize = 0;
  const PluginField attrs[] = {{"top_k", &top_k, PluginFieldType::kINT64, 1},
                               {"normalize", &normalize, PluginFieldType::kINT64, 1}};
  auto built = create(creator, kNode, {2, attrs});
  CHECK(built != nullptr);
  if (built) CHECK_EQ(built->attributes().top_k, 2);
}

TEST(the_creator_declares_the_onnx_attribute_names_and_types) {
  MoECreator creator;
  check_declared(creator, {{"top_k", PluginFieldType::kINT32}, {"normalize", PluginFieldType::kINT32}});
}

TEST(bad_attributes_are_refused_with_one_logged_line) {
  MoECreator creator;
  const int32_t zero = 0, one = 1, two = 2, eight = 8, wide = 33;
  const float k_float = 8.f;
  check_refused(creator, kNode, "dflash::MoE: node 'layer7.mlp.experts': ", {
      {fields(&zero, &one), "top_k must be in [1, experts] and <= 32 (the CUDA kernel's limit), got 0"},
      {fields(&wide, &one), "top_k must be in [1, experts] and <= 32 (the CUDA kernel's limit), got 33"},
      {fields(&eight, &two), "normalize must be 0 or 1, got 2"},
      {{{"top_k", &eight, PluginFieldType::kINT32, 1}}, "missing attribute 'normalize'"},
      {{{"top_k", &k_float, PluginFieldType::kFLOAT32, 1}, {"normalize", &zero, PluginFieldType::kINT32, 1}},
       "attribute 'top_k' must be an integer"},
  });
}

TEST(the_output_has_the_shape_and_dtype_of_hidden) {
  MoEPlugin plugin({8, 1});
  MockExprBuilder builder;
  const nvinfer1::DimsExprs inputs[] = {builder.dims({"t", "2048"}), builder.dims({"t", "256"}),
                                        builder.dims({"256", "1024", "2048"}), builder.dims({"256", "2048", "512"})};
  nvinfer1::DimsExprs out[1];
  CHECK_EQ(plugin.getOutputShapes(inputs, 4, nullptr, 0, out, 1, builder), 0);
  CHECK_EQ(out[0].nbDims, 2);
  CHECK_EQ(text_of(out[0].d[0]) + " " + text_of(out[0].d[1]), std::string("t 2048"));
  DataType type;
  const DataType in_types[4] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kBF16};
  CHECK_EQ(plugin.getOutputDataTypes(&type, 1, in_types, 4), 0);
  CHECK(type == DataType::kBF16);
  CapturedLog log;
  CHECK_EQ(plugin.getOutputShapes(inputs, 3, nullptr, 0, out, 1, builder), -1);
  CHECK(log.contains("dflash::MoE: expects 4 inputs"));
}

TEST(every_tensor_shares_one_float_dtype) {
  MoEPlugin plugin({2, 0});
  for (DataType f : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16}) {
    std::vector<nvinfer1::DynamicPluginTensorDesc> io(5);
    for (auto& desc : io) {
      desc.desc.type = f;
      desc.desc.format = nvinfer1::TensorFormat::kLINEAR;
    }
    for (int pos = 0; pos < 5; ++pos) CHECK(plugin.supportsFormatCombination(pos, io.data(), 4, 1));
    const DataType other = f == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;
    for (int pos = 1; pos < 5; ++pos) {  // the router's logits, the weights and out follow hidden
      io[pos].desc.type = other;
      CHECK(!plugin.supportsFormatCombination(pos, io.data(), 4, 1));
      io[pos].desc.type = f;
    }
  }
}

TEST(input_dims_are_checked_against_the_contract) {
  using dflash::trt::check_moe_dims;
  const auto ok = input_dims(16, 2048, 256, 512);
  CHECK_EQ(check_moe_dims(ok.data(), 4, 8), std::string(""));
  const auto unknown = input_dims(-1, 2048, 256, 512);
  CHECK_EQ(check_moe_dims(unknown.data(), 4, 8), std::string(""));
  CHECK_EQ(check_moe_dims(input_dims(3, 8, 4, 4).data(), 4, 4), std::string(""));  // top_k == experts
  CHECK_EQ(check_moe_dims(input_dims(0, 8, 4, 4).data(), 4, 1), std::string(""));   // no tokens: nothing to do
  CHECK_EQ(check_moe_dims(ok.data(), 3, 8), std::string("expects 4 inputs (hidden, router_logits, gate_up, down)"));
  CHECK_EQ(check_moe_dims(input_dims(16, 64, 4, 8).data(), 4, 5),
           std::string("top_k must be in [1, experts] = [1, 4], got 5"));
  CHECK(check_moe_dims(input_dims(1, 64, 513, 8).data(), 4, 8).find("experts must be <= 512") == 0);
  auto bad_logits = ok;
  bad_logits[1].d[0] = 4;
  CHECK(check_moe_dims(bad_logits.data(), 4, 8).find("router_logits must be [tokens, experts]") == 0);
  auto odd_rows = ok;
  odd_rows[2].d[1] = 1023;
  CHECK(check_moe_dims(odd_rows.data(), 4, 8).find("gate_up must be [experts, 2 * inter, hidden] (gate rows") == 0);
  auto bad_gate_up = ok;
  bad_gate_up[2].d[2] = 1024;
  CHECK_EQ(check_moe_dims(bad_gate_up.data(), 4, 8),
           std::string("gate_up must be [experts, 2 * inter, hidden] = [256, 1024, 2048], got [256, 1024, 1024]"));
  auto bad_experts = ok;
  bad_experts[2].d[0] = 128;
  CHECK(check_moe_dims(bad_experts.data(), 4, 8).find("gate_up must be") == 0);
  auto bad_down = ok;
  bad_down[3].d[2] = 1024;
  CHECK_EQ(check_moe_dims(bad_down.data(), 4, 8),
           std::string("down must be [experts, hidden, inter] = [256, 2048, 512], got [256, 2048, 1024]"));
  auto rank = ok;
  rank[0] = Dims{3, {1, 16, 2048}};
  CHECK_EQ(check_moe_dims(rank.data(), 4, 8),
           std::string("hidden and router_logits must be rank 2, gate_up and down rank 3"));
  // The runtime check (onShapeChange) logs the same line.
  MoEPlugin plugin({5, 1});
  const auto few = input_dims(16, 64, 4, 8);
  nvinfer1::PluginTensorDesc in[4] = {};
  for (int i = 0; i < 4; ++i) in[i].dims = few[i];
  CapturedLog log;
  CHECK_EQ(plugin.onShapeChange(in, 4, nullptr, 1), -1);
  CHECK(log.contains("dflash::MoE: top_k must be in [1, experts] = [1, 4], got 5"));
}

TEST(the_kernel_states_its_limits) {
  CHECK(dflash::moe_unsupported({16, 2048, 256, 512, 8}) == nullptr);
  CHECK(dflash::moe_unsupported({0, 8, 4, 4, 4}) == nullptr);
  CHECK(dflash::moe_unsupported({1, 7, 512, 3, 32}) == nullptr);
  CHECK_EQ(std::string(dflash::moe_unsupported({1, 8, 4, 4, 5})), std::string("top_k must be in [1, experts]"));
  CHECK_EQ(std::string(dflash::moe_unsupported({1, 8, 4, 4, 0})), std::string("top_k must be in [1, experts]"));
  CHECK(dflash::moe_unsupported({1, 8, 513, 4, 8}) != nullptr);
  CHECK(dflash::moe_unsupported({1, 8, 64, 4, 33}) != nullptr);
  CHECK(dflash::moe_unsupported({-1, 8, 4, 4, 2}) != nullptr);
  CHECK(dflash::moe_unsupported({1, 0, 4, 4, 2}) != nullptr);
  CHECK(dflash::moe_unsupported({1, 8, 4, 0, 2}) != nullptr);
}

TEST(the_workspace_for_the_largest_shape_covers_every_smaller_one) {
  // Its regions never overlap and each is 256-byte aligned (16-byte loads of the activations).
  const dflash::MoEShape qwen{16, 2048, 256, 512, 8};
  const dflash::MoEScratch w = dflash::moe_scratch(qwen);
  const size_t starts[] = {w.ids, w.weights, w.counts, w.picked, w.lists, w.act, w.partial, w.total};
  const size_t sizes[] = {128 * 4, 128 * 4, 256 * 4, 257 * 4, 256 * 16 * 4, 128 * 512 * 4, 128 * 2048 * 4};
  for (int i = 0; i < 7; ++i) {
    CHECK(starts[i] % dflash::MoEScratch::kAlign == 0);
    CHECK(starts[i] + sizes[i] <= starts[i + 1]);
  }
  CHECK_EQ(dflash::moe_workspace_size(qwen), w.total);
  // A long prefill runs kMoETokensPerLaunch tokens a launch, in the same scratch.
  CHECK_EQ(dflash::moe_workspace_size({100000, 2048, 256, 512, 8}),
           dflash::moe_workspace_size({dflash::kMoETokensPerLaunch, 2048, 256, 512, 8}));
  for (int64_t t : {0, 1, 16, 200, 512, 513})
    for (int64_t h : {8, 37, 2048})
      for (int64_t e : {1, 8, 256})
        for (int64_t i : {3, 512})
          for (int64_t k : {1, 8}) {
            const dflash::MoEShape s{t, h, e, i, k};
            for (const dflash::MoEShape& larger :
                 {dflash::MoEShape{t + 1, h, e, i, k}, dflash::MoEShape{t, h + 1, e, i, k},
                  dflash::MoEShape{t, h, e + 1, i, k}, dflash::MoEShape{t, h, e, i + 1, k},
                  dflash::MoEShape{t, h, e, i, k + 1}})
              CHECK(dflash::moe_workspace_size(larger) >= dflash::moe_workspace_size(s));
          }
}
