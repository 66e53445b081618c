// The library's entry points and shared rules: what TensorRT sees when it loads
// libdflash_trt_plugins.so, the dtype/format rule, attribute-field reading, error logging.
#include <cstring>
#include <vector>

#include "captured_log.h"
#include "check.h"
#include "tensorrt/plugin_common.h"

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& count);
extern "C" int DflashOpsVersion();

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

namespace {

std::vector<nvinfer1::DynamicPluginTensorDesc> descs(const std::vector<DataType>& types) {
  std::vector<nvinfer1::DynamicPluginTensorDesc> out(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    out[i].desc.type = types[i];
    out[i].desc.format = TensorFormat::kLINEAR;
  }
  return out;
}

bool all_ok(const std::vector<nvinfer1::DynamicPluginTensorDesc>& in_out, uint32_t int64_positions,
            uint32_t float32_positions = 0) {
  for (int32_t pos = 0; pos < static_cast<int32_t>(in_out.size()); ++pos) {
    if (!dflash::trt::format_combination_ok(pos, in_out.data(), static_cast<int32_t>(in_out.size()), int64_positions,
                                            float32_positions))
      return false;
  }
  return true;
}

}  // namespace

TEST(creators_are_named_as_the_onnx_op_types_version_1_empty_namespace) {
  int32_t count = -1;
  nvinfer1::IPluginCreatorInterface* const* creators = getCreators(count);
  CHECK_EQ(count, 4);
  std::vector<std::string> names;
  for (int32_t i = 0; i < count; ++i) {
    auto* creator = dynamic_cast<nvinfer1::IPluginCreatorV3One*>(creators[i]);
    CHECK(creator != nullptr);
    CHECK_EQ(std::string(creators[i]->getInterfaceInfo().kind), std::string("PLUGIN CREATOR_V3ONE"));
    names.push_back(creator->getPluginName());
    CHECK_EQ(creator->getPluginVersion(), std::string("1"));
    CHECK_EQ(creator->getPluginNamespace(), std::string(""));
  }
  CHECK(names == (std::vector<std::string>{"InjectKV", "BlockAttention", "GatedDeltaRule", "MoE"}));
  CHECK_EQ(DflashOpsVersion(), 1);
}

TEST(errors_go_to_the_logger_tensorrt_hands_over) {
  CapturedLog log;
  dflash::trt::log_error("something broke");
  CHECK(log.contains("something broke"));
}

TEST(float_tensors_share_one_of_three_dtypes_in_linear_format) {
  for (DataType type : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    CHECK(all_ok(descs({type, type, type}), 0));
  CHECK(!all_ok(descs({DataType::kFLOAT, DataType::kHALF, DataType::kFLOAT}), 0));  // mixed
  CHECK(!all_ok(descs({DataType::kINT8, DataType::kINT8}), 0));
  CHECK(!all_ok(descs({DataType::kFP8, DataType::kFP8}), 0));
  auto chw = descs({DataType::kHALF, DataType::kHALF});
  chw[1].desc.format = TensorFormat::kCHW32;
  CHECK(!all_ok(chw, 0));
}

TEST(int64_positions_take_int64_only_and_do_not_set_the_float_dtype) {
  const uint32_t second = 1u << 1;
  CHECK(all_ok(descs({DataType::kBF16, DataType::kINT64, DataType::kBF16}), second));
  CHECK(all_ok(descs({DataType::kINT64, DataType::kHALF, DataType::kHALF}), 1u));
  CHECK(!all_ok(descs({DataType::kBF16, DataType::kINT32, DataType::kBF16}), second));
  CHECK(!all_ok(descs({DataType::kBF16, DataType::kBF16, DataType::kBF16}), second));
  CHECK(!dflash::trt::format_combination_ok(3, descs({DataType::kFLOAT}).data(), 1, 0));  // out of range
}

TEST(float32_positions_take_float32_only_and_do_not_set_the_float_dtype) {
  const uint32_t first = 1u;
  CHECK(all_ok(descs({DataType::kFLOAT, DataType::kHALF, DataType::kHALF}), 0, first));
  CHECK(all_ok(descs({DataType::kFLOAT, DataType::kBF16, DataType::kINT64, DataType::kBF16}), 1u << 2, first));
  CHECK(!all_ok(descs({DataType::kHALF, DataType::kHALF, DataType::kHALF}), 0, first));
  CHECK(!all_ok(descs({DataType::kFLOAT, DataType::kHALF, DataType::kBF16}), 0, first));
}

TEST(fields_are_read_as_int32_or_int64_and_float32_or_float64) {
  const int32_t i32 = 7;
  const int64_t i64 = -3;
  const float f32 = 0.25f;
  const double f64 = 0.5;
  const PluginField fields[] = {{"a", &i32, PluginFieldType::kINT32, 1},
                                {"b", &i64, PluginFieldType::kINT64, 1},
                                {"c", &f32, PluginFieldType::kFLOAT32, 1},
                                {"d", &f64, PluginFieldType::kFLOAT64, 1}};
  const nvinfer1::PluginFieldCollection fc{4, fields};
  int64_t i = 0;
  float f = 0.f;
  std::string error;
  CHECK(dflash::trt::read_int_field(&fc, "a", &i, &error) && i == 7);
  CHECK(dflash::trt::read_int_field(&fc, "b", &i, &error) && i == -3);
  CHECK(dflash::trt::read_float_field(&fc, "c", &f, &error) && f == 0.25f);
  CHECK(dflash::trt::read_float_field(&fc, "d", &f, &error) && f == 0.5f);
}

TEST(a_missing_mistyped_or_multi_valued_field_is_refused_with_its_name) {
  const float f32 = 1.f;
  const int32_t pair[] = {1, 2};
  const PluginField fields[] = {{"f", &f32, PluginFieldType::kFLOAT32, 1}, {"p", pair, PluginFieldType::kINT32, 2}};
  const nvinfer1::PluginFieldCollection fc{2, fields};
  int64_t i = 0;
  float f = 0.f;
  std::string error;
  CHECK(!dflash::trt::read_int_field(&fc, "f", &i, &error));
  CHECK_EQ(error, std::string("attribute 'f' must be an integer"));
  CHECK(!dflash::trt::read_int_field(&fc, "p", &i, &error));
  CHECK_EQ(error, std::string("attribute 'p' must be one value"));
  CHECK(!dflash::trt::read_float_field(&fc, "x", &f, &error));
  CHECK_EQ(error, std::string("missing attribute 'x'"));
  CHECK(!dflash::trt::read_float_field(nullptr, "x", &f, &error));
}
