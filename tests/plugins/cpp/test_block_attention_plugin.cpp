// The BlockAttention plugin's host side: attributes in and out of an engine, refusals, output
// shape, format rule, shape checks and the launch plan's workspace bound. The kernel itself is
// tested on a GPU (kernel_parity.cpp).
#include <cmath>
#include <memory>

#include "block_attention/block_attention_kernel.h"
#include "block_attention/block_attention_plugin.h"
#include "captured_log.h"
#include "check.h"
#include "mock_expr_builder.h"
#include "plugin_harness.h"

using dflash::trt::BlockAttentionCreator;
using dflash::trt::BlockAttentionPlugin;
using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace {

constexpr char kNode[] = "layer3.attention";

// q [b, heads, n, d], k/v_context [b, kv, C, d], k/v_block [b, kv, n, d], context_lengths [b]
std::vector<Dims> input_dims(int64_t b, int64_t heads, int64_t kv, int64_t n, int64_t c, int64_t d) {
  return {Dims{4, {b, heads, n, d}}, Dims{4, {b, kv, c, d}}, Dims{4, {b, kv, c, d}},
          Dims{4, {b, kv, n, d}},    Dims{4, {b, kv, n, d}}, Dims{1, {b}}};
}

}  // namespace

TEST(onnx_attributes_survive_serialization_into_an_engine) {
  BlockAttentionCreator creator;
  const float scale = 0.0883883f;
  const int32_t causal = 1, window = 512;
  const PluginField attrs[] = {{"scale", &scale, PluginFieldType::kFLOAT32, 1},
                               {"causal", &causal, PluginFieldType::kINT32, 1},
                               {"window", &window, PluginFieldType::kINT32, 1}};
  auto built = create(creator, kNode, {3, attrs});
  CHECK(built != nullptr);
  if (!built) return;
  auto restored = reload(creator, kNode, *built);
  CHECK(restored != nullptr);
  if (!restored) return;
  CHECK_EQ(restored->attributes().scale, scale);
  CHECK_EQ(restored->attributes().causal, 1);
  CHECK_EQ(restored->attributes().window, 512);
  std::unique_ptr<nvinfer1::IPluginV3> copy(built->clone());
  CHECK_EQ(static_cast<BlockAttentionPlugin*>(copy.get())->attributes().window, 512);
}

TEST(the_creator_declares_the_onnx_attribute_names_and_types) {
  BlockAttentionCreator creator;
  check_declared(creator, {{"scale", PluginFieldType::kFLOAT32},
                          {"causal", PluginFieldType::kINT32},
                          {"window", PluginFieldType::kINT32}});
}

TEST(bad_attributes_are_refused_with_one_logged_line) {
  BlockAttentionCreator creator;
  const float scale = 0.125f, inf = INFINITY;
  const int32_t zero = 0, two = 2, minus = -1;
  auto fields = [&](const float* s, const int32_t* causal, const int32_t* window) {
    return std::vector<PluginField>{{"scale", s, PluginFieldType::kFLOAT32, 1},
                                    {"causal", causal, PluginFieldType::kINT32, 1},
                                    {"window", window, PluginFieldType::kINT32, 1}};
  };
  check_refused(creator, kNode, "dflash::BlockAttention: node 'layer3.attention': ", {
      {fields(&scale, &two, &zero), "causal must be 0 or 1, got 2"},
      {fields(&scale, &zero, &minus), "window must be >= 0 (0: none), got -1"},
      {fields(&inf, &zero, &zero), "scale must be finite"},
      {{{"scale", &scale, PluginFieldType::kFLOAT32, 1}, {"causal", &zero, PluginFieldType::kINT32, 1}},
       "missing attribute 'window'"},
      {{{"scale", &zero, PluginFieldType::kINT32, 1},
        {"causal", &zero, PluginFieldType::kINT32, 1},
        {"window", &zero, PluginFieldType::kINT32, 1}},
       "attribute 'scale' must be a float"},
  });
}

TEST(the_output_has_the_shape_and_dtype_of_q) {
  BlockAttentionPlugin plugin({0.125f, 0, 0});
  MockExprBuilder builder;
  const nvinfer1::DimsExprs inputs[] = {builder.dims({"b", "32", "n", "128"}), builder.dims({"b", "8", "C", "128"}),
                                        builder.dims({"b", "8", "C", "128"}),  builder.dims({"b", "8", "n", "128"}),
                                        builder.dims({"b", "8", "n", "128"}),  builder.dims({"b"})};
  nvinfer1::DimsExprs out[1];
  CHECK_EQ(plugin.getOutputShapes(inputs, 6, nullptr, 0, out, 1, builder), 0);
  CHECK_EQ(out[0].nbDims, 4);
  CHECK_EQ(text_of(out[0].d[0]) + " " + text_of(out[0].d[1]) + " " + text_of(out[0].d[2]) + " " + text_of(out[0].d[3]),
           std::string("b 32 n 128"));
  DataType type;
  const DataType in_types[6] = {DataType::kHALF, DataType::kHALF, DataType::kHALF,
                                DataType::kHALF, DataType::kHALF, DataType::kINT64};
  CHECK_EQ(plugin.getOutputDataTypes(&type, 1, in_types, 6), 0);
  CHECK(type == DataType::kHALF);
  CapturedLog log;
  CHECK_EQ(plugin.getOutputShapes(inputs, 5, nullptr, 0, out, 1, builder), -1);
  CHECK(log.contains("dflash::BlockAttention: expects 6 inputs"));
}

TEST(context_lengths_is_int64_and_the_rest_share_one_float_dtype) {
  BlockAttentionPlugin plugin({0.125f, 0, 0});
  for (DataType f : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16}) {
    std::vector<nvinfer1::DynamicPluginTensorDesc> io(7);
    for (int i = 0; i < 7; ++i) {
      io[i].desc.type = i == 5 ? DataType::kINT64 : f;
      io[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
    }
    for (int pos = 0; pos < 7; ++pos) CHECK(plugin.supportsFormatCombination(pos, io.data(), 6, 1));
    io[5].desc.type = DataType::kINT32;
    CHECK(!plugin.supportsFormatCombination(5, io.data(), 6, 1));
    io[5].desc.type = DataType::kINT64;
    io[6].desc.type = f == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;  // output differs from q
    CHECK(!plugin.supportsFormatCombination(6, io.data(), 6, 1));
  }
}

TEST(input_dims_are_checked_against_the_contract) {
  const auto ok = input_dims(2, 32, 8, 16, 4096, 128);
  CHECK_EQ(dflash::trt::check_block_attention_dims(ok.data(), 6), std::string(""));
  const auto unknown = input_dims(-1, 32, 8, -1, -1, 128);
  CHECK_EQ(dflash::trt::check_block_attention_dims(unknown.data(), 6), std::string(""));
  const auto gqa = input_dims(1, 12, 8, 16, 64, 128);
  CHECK(dflash::trt::check_block_attention_dims(gqa.data(), 6).find("must be a multiple of kv_heads") !=
        std::string::npos);
  const auto wide = input_dims(1, 8, 8, 16, 64, 512);
  CHECK(dflash::trt::check_block_attention_dims(wide.data(), 6).find("head_dim must be in [1, 256]") == 0);
  auto bad_block = ok;
  bad_block[3].d[2] = 8;
  CHECK(dflash::trt::check_block_attention_dims(bad_block.data(), 6).find("k_block and v_block must be") == 0);
  auto bad_v = ok;
  bad_v[2].d[2] = 100;
  CHECK(dflash::trt::check_block_attention_dims(bad_v.data(), 6).find("k_context and v_context must be") == 0);
  auto bad_lengths = ok;
  bad_lengths[5].d[0] = 3;
  CHECK(dflash::trt::check_block_attention_dims(bad_lengths.data(), 6).find("context_lengths must be") == 0);
}

TEST(the_workspace_for_the_largest_shape_covers_every_smaller_one) {
  // What a launch uses (block_attention_plan: splits x rows x (d + 2) floats when it splits) never
  // exceeds the reserved size, which grows with every dim.
  for (int64_t b : {1, 2, 8, 64})
    for (int64_t kv : {1, 8})
      for (int64_t groups : {1, 4})
        for (int64_t n : {1, 16})
          for (int64_t c : {0, 100, 1000, 16384})
            for (int64_t d : {64, 128, 256})
              for (bool mma : {false, true}) {
                const dflash::BlockAttentionShape s{b, kv * groups, kv, n, c, d};
                const dflash::BlockAttentionPlan plan = dflash::block_attention_plan(s, mma);
                const int64_t rows = b * kv * groups * n;
                const size_t used =
                    plan.splits > 1 ? static_cast<size_t>(plan.splits * rows * (d + 2)) * sizeof(float) : 0;
                CHECK(used <= dflash::block_attention_workspace_size(s));
                CHECK(plan.splits >= 1 && plan.splits <= dflash::BlockAttentionPlan::kMaxSplits);
                CHECK(plan.query_tiles * plan.tile_rows >= groups * n);
                for (const dflash::BlockAttentionShape& larger :
                     {dflash::BlockAttentionShape{b + 1, kv * groups, kv, n, c, d},
                      dflash::BlockAttentionShape{b, kv * groups + kv, kv, n, c, d},
                      dflash::BlockAttentionShape{b, kv * groups, kv, n + 1, c, d},
                      dflash::BlockAttentionShape{b, kv * groups, kv, n, c + 1, d},
                      dflash::BlockAttentionShape{b, kv * groups, kv, n, c, d + 1}})
                  CHECK(dflash::block_attention_workspace_size(larger) >= dflash::block_attention_workspace_size(s));
              }
}

TEST(a_long_context_at_batch_one_is_split_over_keys) {
  // Qwen3-8B drafter shape: 32 heads over 8 kv heads, block 16, 16k context.
  const dflash::BlockAttentionPlan plan = dflash::block_attention_plan({1, 32, 8, 16, 16384, 128}, false);
  CHECK_EQ(plan.query_tiles, 4);  // 4 heads x 16 slots = 64 rows per kv head, 16 per block
  CHECK(plan.splits >= 16);
  CHECK_EQ(dflash::block_attention_plan({64, 32, 8, 16, 256, 128}, false).splits, 1);  // already many blocks
  // Tensor cores: the group's 64 rows in one block; 8 blocks split 32 ways fill 256.
  const dflash::BlockAttentionPlan mma = dflash::block_attention_plan({1, 32, 8, 16, 16384, 128}, true);
  CHECK_EQ(mma.query_tiles, 1);
  CHECK_EQ(mma.splits, 32);
  CHECK(!mma.key_split);
}

TEST(a_decode_step_on_tensor_cores_splits_each_tile_s_keys_over_the_warps) {
  // A target's plain step: one query a row, 4 query heads a kv head = 4 rows a group, which one
  // 16-row tile holds (a 64-row tile would spend 3 of its 4 warps on padding).
  const dflash::BlockAttentionPlan step = dflash::block_attention_plan({1, 32, 8, 1, 4096, 128}, true);
  CHECK(step.key_split);
  CHECK_EQ(step.tile_rows, 16);
  CHECK_EQ(step.query_tiles, 1);
  CHECK_EQ(step.splits, 32);  // 8 blocks split 32 ways fill 256, as the 64-row tiles do
  CHECK(dflash::block_attention_plan({1, 32, 8, 4, 4096, 128}, true).key_split);    // 16 rows: still one tile
  CHECK(!dflash::block_attention_plan({1, 32, 8, 5, 4096, 128}, true).key_split);   // 20 rows: 64-row tiles
  CHECK(!dflash::block_attention_plan({1, 32, 8, 1, 4096, 128}, false).key_split);  // CUDA cores: never
}
