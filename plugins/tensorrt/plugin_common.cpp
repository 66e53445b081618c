// Shared host-side helpers of the dflash TensorRT plugins (see plugin_common.h).
#include "tensorrt/plugin_common.h"

#include <atomic>
#include <cstdio>
#include <cstring>

namespace dflash::trt {
namespace {

std::atomic<nvinfer1::ILoggerFinder*> g_logger_finder{nullptr};

const nvinfer1::PluginField* find_field(const nvinfer1::PluginFieldCollection* fc, const char* name) {
  if (fc == nullptr || (fc->nbFields > 0 && fc->fields == nullptr)) return nullptr;
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    const nvinfer1::PluginField& field = fc->fields[i];
    if (field.name != nullptr && std::strcmp(field.name, name) == 0) return &field;
  }
  return nullptr;
}

const nvinfer1::PluginField* find_scalar(const nvinfer1::PluginFieldCollection* fc, const char* name,
                                         std::string* error) {
  const nvinfer1::PluginField* field = find_field(fc, name);
  if (field == nullptr) {
    *error = std::string("missing attribute '") + name + "'";
    return nullptr;
  }
  if (field->data == nullptr || field->length != 1) {
    *error = std::string("attribute '") + name + "' must be one value";
    return nullptr;
  }
  return field;
}

// One value of type Narrow or Wide (the field says which) into `*value`; else false with `*error` set.
template <typename Narrow, typename Wide, typename Out>
bool read_scalar(const nvinfer1::PluginFieldCollection* fc, const char* name, nvinfer1::PluginFieldType narrow,
                 nvinfer1::PluginFieldType wide, const char* kind, Out* value, std::string* error) {
  const nvinfer1::PluginField* field = find_scalar(fc, name, error);
  if (field == nullptr) return false;
  if (field->type == narrow) {
    *value = static_cast<Out>(*static_cast<const Narrow*>(field->data));
  } else if (field->type == wide) {
    *value = static_cast<Out>(*static_cast<const Wide*>(field->data));
  } else {
    *error = std::string("attribute '") + name + "' must be " + kind;
    return false;
  }
  return true;
}

}  // namespace

void set_logger_finder(nvinfer1::ILoggerFinder* finder) noexcept { g_logger_finder.store(finder); }

void log_error(const char* message) noexcept {
  nvinfer1::ILoggerFinder* finder = g_logger_finder.load();
  nvinfer1::ILogger* logger = nullptr;
  try {
    logger = finder != nullptr ? finder->findLogger() : nullptr;  // findLogger is not declared noexcept
  } catch (...) {
    logger = nullptr;
  }
  if (logger != nullptr) {
    logger->log(nvinfer1::ILogger::Severity::kERROR, message);
  } else {
    std::fprintf(stderr, "[dflash_trt_plugins] ERROR: %s\n", message);
  }
}

void log_error(const std::string& message) noexcept { log_error(message.c_str()); }

int32_t log_op_error(const char* op, const char* what, const char* detail) noexcept {
  try {
    log_error(std::string("dflash::") + op + ": " + what + detail);
  } catch (...) {
    log_error(what);
  }
  return -1;
}

bool to_dtype(nvinfer1::DataType type, DType* out) noexcept {
  switch (type) {
    case nvinfer1::DataType::kFLOAT:
      *out = DType::kFloat32;
      return true;
    case nvinfer1::DataType::kHALF:
      *out = DType::kFloat16;
      return true;
    case nvinfer1::DataType::kBF16:
      *out = DType::kBFloat16;
      return true;
    default:
      return false;
  }
}

bool format_combination_ok(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_in_out,
                           uint32_t int64_positions, uint32_t float32_positions) noexcept {
  if (in_out == nullptr || pos < 0 || pos >= nb_in_out || pos >= 32) return false;
  const nvinfer1::PluginTensorDesc& desc = in_out[pos].desc;
  if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
  if (int64_positions & (1u << pos)) return desc.type == nvinfer1::DataType::kINT64;
  if (float32_positions & (1u << pos)) return desc.type == nvinfer1::DataType::kFLOAT;
  DType unused;
  if (!to_dtype(desc.type, &unused)) return false;
  // TensorRT asks position by position, earlier ones already fixed: match the first free float one.
  const uint32_t fixed = int64_positions | float32_positions;
  for (int32_t first = 0; first < pos; ++first) {
    if (!(fixed & (1u << first))) return desc.type == in_out[first].desc.type;
  }
  return true;
}

bool read_int_field(const nvinfer1::PluginFieldCollection* fc, const char* name, int64_t* value, std::string* error) {
  return read_scalar<int32_t, int64_t>(fc, name, nvinfer1::PluginFieldType::kINT32, nvinfer1::PluginFieldType::kINT64,
                                       "an integer", value, error);
}

bool read_float_field(const nvinfer1::PluginFieldCollection* fc, const char* name, float* value, std::string* error) {
  return read_scalar<float, double>(fc, name, nvinfer1::PluginFieldType::kFLOAT32,
                                    nvinfer1::PluginFieldType::kFLOAT64, "a float", value, error);
}

bool same_dim(int64_t a, int64_t b) noexcept { return a < 0 || b < 0 || a == b; }

bool dims_match(const nvinfer1::Dims& have, const nvinfer1::Dims& want) noexcept {
  if (have.nbDims != want.nbDims) return false;
  for (int32_t i = 0; i < have.nbDims; ++i) {
    if (!same_dim(have.d[i], want.d[i])) return false;
  }
  return true;
}

std::string to_string(const nvinfer1::Dims& dims) {
  std::string text = "[";
  for (int32_t i = 0; i < dims.nbDims; ++i) text += (i ? ", " : "") + std::to_string(dims.d[i]);
  return text + "]";
}

}  // namespace dflash::trt
