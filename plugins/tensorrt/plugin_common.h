// What the dflash TensorRT plugins share: logging through TensorRT's logger, reading attribute
// fields, and the dtype/format rule. Everything here is host-only and testable without a GPU.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace dflash::trt {

// setLoggerFinder (the library entry point TensorRT calls on load) stores TensorRT's finder here;
// without one (a process that did not load us through TensorRT) messages go to stderr.
void set_logger_finder(nvinfer1::ILoggerFinder* finder) noexcept;
void log_error(const char* message) noexcept;
void log_error(const std::string& message) noexcept;
// Logs "dflash::<op>: <what><detail>"; returns -1, TensorRT's failure status.
int32_t log_op_error(const char* op, const char* what, const char* detail = "") noexcept;

// TensorRT's float types onto the kernels' own enum; false for any other type.
bool to_dtype(nvinfer1::DataType type, DType* out) noexcept;

// The format rule of every dflash plugin: linear layout everywhere; the positions in the bitmask
// `int64_positions` are int64, those in `float32_positions` float32 whatever the rest is (states
// kept in float32); every other tensor is float32, float16 or bfloat16, and all of them the same
// one (that of the first such position). Positions count inputs, then outputs.
bool format_combination_ok(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_in_out,
                           uint32_t int64_positions, uint32_t float32_positions = 0) noexcept;

// Reads one scalar attribute from `fc`: ONNX attributes at build time (the ONNX parser converts
// them to the type getFieldNames declares), getFieldsToSerialize's fields when an engine is
// deserialized. Integer fields may be int32 or int64, float fields float32 or float64. Returns
// false with `*error` set when the field is missing, not one value, or of another type.
bool read_int_field(const nvinfer1::PluginFieldCollection* fc, const char* name, int64_t* value, std::string* error);
bool read_float_field(const nvinfer1::PluginFieldCollection* fc, const char* name, float* value, std::string* error);

// True when a and b are equal or either is not known yet (-1).
bool same_dim(int64_t a, int64_t b) noexcept;
// True when every dim TensorRT knows (>= 0) equals `want`'s, or `want`'s is -1; ranks must match.
bool dims_match(const nvinfer1::Dims& have, const nvinfer1::Dims& want) noexcept;

// "[2, -1, 8]" for messages.
std::string to_string(const nvinfer1::Dims& dims);

}  // namespace dflash::trt
