// graph.h: one compiled graph (an onnxruntime session, a TensorRT engine) as the slot executor
// runs it: bind every input and output to device memory by name, then run.
//
// Binding an output to the very memory an input is bound to asks the graph to write that buffer in
// place (the slot caches: onnxruntime's GroupQueryAttention and TensorScatter, TensorRT's KV-cache
// update). Bindings hold until `clear`; the memory must outlive the run.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
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
  // Returns when the outputs may be read through the device (ordered, not necessarily finished): true
  // where this run paid one-time set-up that the next run of its shape will not (onnxruntime planning
  // a new [rows, tokens], TensorRT's first enqueue of a binding, a CUDA graph capture), so that its
  // time is no measure of the next run's.
  virtual bool run(const std::string& what) = 0;
};

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Which runs are the first of their key (a graph's shapes, bindings): the runs that pay set-up. Past
// kKept keys nothing more is remembered, and a new key's run counts as warm.
class FirstRuns {
 public:
  static constexpr size_t kKept = 4096;
  bool first(const std::string& key) {
    if (seen_.size() >= kKept) return false;
    return seen_.insert(key).second;
  }

 private:
  std::set<std::string> seen_;
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
