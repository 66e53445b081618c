// py_graph.h: a GraphBackend whose graphs are Python objects, so the slot executor runs models that
// live in Python (dflash_trt/runtime/torch_graphs.py: the export's contract-2 torch modules in
// PyTorch) over the same slot buffers, phases and staging as onnxruntime and TensorRT.
//
// The device is the host (PyTorch on the CPU reads the executor's host memory) or, where the core
// was built with the CUDA headers, a CudaDevice: the real driver, the buffers TensorRT would get,
// and its stream handed to the Python side, which runs the graphs on it. Only libnvinfer is swapped
// out.
//
// The Python object `graphs` answers `open(path) -> graph`, `version() -> str` and, on a CUDA device,
// `use_stream(handle)` once before any open; a graph answers `run(what, inputs, outputs, bindings)`,
// inputs and outputs each a dict name -> (address, dtype name, shape) that it must not change, bindings
// their number (the same for the same bindings, per graph), and returns once its outputs are written
// (ordered on the stream): True where the run paid one-time set-up (Graph::run), else False or None.
// Phases run without the GIL (Scheduler.step releases it); each call here takes it.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "slot_executor.h"

namespace dflash {

// The executor over `graphs` on `device`: "cpu", or "cuda" (GPU 0 through `config.driver_path`).
class PyGraphExecutor final : public SlotExecutor {
 public:
  PyGraphExecutor(const SlotExecutorConfig& config, pybind11::object graphs, const std::string& device);
};

// True where the core was built with the CUDA headers (a "cuda" device can be asked for).
bool has_cuda_device();

}  // namespace dflash
