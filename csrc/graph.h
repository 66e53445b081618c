// graph.h: one compiled graph (an onnxruntime session, a TensorRT engine) as the slot executor
// runs it: bind every input and output to device memory by name, then run.
//
// Binding an output to the very memory an input is bound to asks the graph to write that buffer in
// place (the slot caches: onnxruntime's GroupQueryAttention and TensorScatter, TensorRT's KV-cache
// update). Bindings hold until `clear`; the memory must outlive the run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device.h"

namespace dflash {

struct TensorRef {
  void* data;
  DType dtype;
  std::vector<int64_t> shape;
};

inline bool operator==(const TensorRef& a, const TensorRef& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape;
}

class Graph {
 public:
  virtual ~Graph() = default;
  virtual void clear() = 0;
  virtual void input(const std::string& name, const TensorRef& tensor) = 0;
  virtual void output(const std::string& name, const TensorRef& tensor) = 0;
  // Runs over the bound memory; `what` names the run in an error ("running target.onnx").
  // Returns when the outputs may be read through the device (ordered, not necessarily finished).
  virtual void run(const std::string& what) = 0;
};

// A runtime that opens graphs whose memory lives on its device.
class GraphBackend {
 public:
  virtual ~GraphBackend() = default;
  virtual Device& device() = 0;
  virtual std::unique_ptr<Graph> open(const std::string& path) = 0;
  virtual std::string name() const = 0;     // "onnxruntime", "TensorRT": error messages
  virtual std::string version() const = 0;  // the loaded library's
};

}  // namespace dflash
