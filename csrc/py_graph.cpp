// py_graph.cpp: Python graphs behind the slot executor (py_graph.h).
#include "py_graph.h"

#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#ifdef DFLASH_WITH_CUDA
#include "cuda_device.h"
#endif

namespace py = pybind11;

namespace dflash {

namespace {

constexpr char kWhy[] = "the torch graph executor";

const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int64: return "int64";
  }
  DFLASH_INVARIANT(false);
  return "";
}

class PyGraph final : public Graph {
 public:
  explicit PyGraph(py::object graph) : graph_(std::move(graph)) {}
  ~PyGraph() override {
    py::gil_scoped_acquire gil;
    known_.clear();  // its dicts go while the GIL is held
    unnumbered_.reset();
    graph_ = py::object();
  }
  void clear() override {
    inputs_.clear();
    outputs_.clear();
  }
  void input(const std::string& name, const TensorRef& tensor) override { inputs_[name] = tensor; }
  void output(const std::string& name, const TensorRef& tensor) override { outputs_[name] = tensor; }
  bool run(const std::string& what) override {
    py::gil_scoped_acquire gil;
    const Bindings& bound = bindings();
    const py::object set_up = graph_.attr("run")(what, bound.inputs, bound.outputs, bound.id);
    return !set_up.is_none() && set_up.cast<bool>();
  }

 private:
  // A set of bindings as the Python graph gets them, and its number: the same number whenever the same
  // bindings recur, so a Python graph keys its CUDA graphs on it. A decode loop binds a few sets over and
  // over; converting a deep model's 150 bindings and hashing them again every run cost ~2 us a layer.
  struct Bindings {
    std::map<std::string, TensorRef> bound_inputs, bound_outputs;
    py::dict inputs, outputs;
    int64_t id;  // -1: past kKnown sets, not numbered (the graph runs it eagerly)
  };
  // Sets numbered, at most (more than a graph captures: runtime/torch_graphs.py's GRAPHS_KEPT); a set seen
  // after them is converted each run and not numbered.
  static constexpr size_t kKnown = 1024;

  static size_t hash_of(const std::map<std::string, TensorRef>& bound) {
    size_t h = bound.size();
    const auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (const auto& [name, t] : bound) {
      mix(std::hash<std::string>()(name));
      mix(reinterpret_cast<uintptr_t>(t.data));
      mix(size_t(t.dtype));
      for (int64_t d : t.shape) mix(size_t(d));
    }
    return h;
  }
  bool same(const Bindings& b) const { return b.bound_inputs == inputs_ && b.bound_outputs == outputs_; }

  const Bindings& bindings() {
    if (last_ < known_.size() && same(known_[last_])) return known_[last_];
    const size_t h = hash_of(inputs_) ^ (hash_of(outputs_) * 31);
    const auto [first, end] = index_.equal_range(h);
    for (auto at = first; at != end; ++at)
      if (same(known_[at->second])) return known_[last_ = at->second];
    if (known_.size() == kKnown) {
      unnumbered_ = Bindings{inputs_, outputs_, as_dict(inputs_), as_dict(outputs_), -1};
      return *unnumbered_;
    }
    index_.emplace(h, known_.size());
    known_.push_back({inputs_, outputs_, as_dict(inputs_), as_dict(outputs_), int64_t(known_.size())});
    return known_[last_ = known_.size() - 1];
  }
  // name -> (address, dtype name, shape tuple), in name order (a std::map's)
  static py::dict as_dict(const std::map<std::string, TensorRef>& bound) {
    py::dict out;
    for (const auto& [name, t] : bound)
      out[py::str(name)] = py::make_tuple(reinterpret_cast<uintptr_t>(t.data), dtype_name(t.dtype),
                                          py::tuple(py::cast(t.shape)));
    return out;
  }
  py::object graph_;
  std::map<std::string, TensorRef> inputs_, outputs_;
  std::vector<Bindings> known_;  // numbered by position
  std::unordered_multimap<size_t, size_t> index_;  // hash_of both maps -> positions in known_
  size_t last_ = 0;  // the last set run
  std::optional<Bindings> unnumbered_;  // the last set run past kKnown
};

class PyGraphBackend final : public GraphBackend {
 public:
  PyGraphBackend(py::object graphs, std::unique_ptr<Device> device)
      : device_(std::move(device)), graphs_(std::move(graphs)) {
    py::gil_scoped_acquire gil;
    version_ = py::str(graphs_.attr("version")());
  }
  ~PyGraphBackend() override {
    py::gil_scoped_acquire gil;
    graphs_ = py::object();
  }
  Device& device() override { return *device_; }
  std::unique_ptr<Graph> open(const std::string& path) override {
    py::gil_scoped_acquire gil;
    return std::make_unique<PyGraph>(graphs_.attr("open")(path));
  }
  std::string name() const override { return "torch"; }
  std::string version() const override { return version_; }

 private:
  std::unique_ptr<Device> device_;  // first in, last out: graphs may hold views of its memory
  py::object graphs_;
  std::string version_;
};

std::unique_ptr<GraphBackend> backend(const SlotExecutorConfig& config, py::object graphs, const std::string& device) {
  config.validate(kWhy);
  if (device == "cpu") return std::make_unique<PyGraphBackend>(std::move(graphs), std::make_unique<HostDevice>());
  if (device != "cuda") throw Error(std::string(kWhy) + ": unknown device '" + device + "' (cpu or cuda)");
#ifdef DFLASH_WITH_CUDA
  auto cuda = std::make_unique<CudaDevice>(config.driver_path, kWhy);
  graphs.attr("use_stream")(reinterpret_cast<uintptr_t>(cuda->stream()));
  return std::make_unique<PyGraphBackend>(std::move(graphs), std::move(cuda));
#else
  throw Error(std::string(kWhy) + ": this build of dflash_trt._core has no CUDA device (no CUDA headers when it "
              "was compiled): reinstall where the CUDA toolkit is installed");
#endif
}

}  // namespace

bool has_cuda_device() {
#ifdef DFLASH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

PyGraphExecutor::PyGraphExecutor(const SlotExecutorConfig& config, py::object graphs, const std::string& device)
    : SlotExecutor(config, backend(config, std::move(graphs), device), kWhy) {}

}  // namespace dflash
