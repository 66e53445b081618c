// slot_bindings.cpp: the slot executors' Python face: _core.ExecutorConfig (alias OrtExecutorConfig),
// _core.SlotExecutor (the phases, callable one by one), _core.PyGraphExecutor (Python graphs: the
// torch backend), _core.OrtExecutor / _core.TrtExecutor, and the flags _core.HAS_ORT_EXECUTOR /
// HAS_TRT_EXECUTOR / HAS_CUDA_DEVICE. Compiled in every build; the onnxruntime and TensorRT executors
// only when setup.py found their headers (DFLASH_WITH_ORT, DFLASH_WITH_TRT).
// dflash_trt/runtime/ort_executor.py fills the config from a bundle; an executor goes to
// _core.Scheduler like any other (it is an _core.Executor).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "py_graph.h"
#include "slot_executor.h"
#ifdef DFLASH_WITH_ORT
#include "ort_executor.h"
#endif
#ifdef DFLASH_WITH_TRT
#include <NvInferVersion.h>

#include "trt_executor.h"
#endif

namespace py = pybind11;

namespace {

py::list as_arrays(const std::vector<dflash::LogitsRows>& logits) {
  py::list out;
  for (const dflash::LogitsRows& l : logits) {
    py::array_t<float> a({l.rows, l.vocab});
    std::copy(l.data.begin(), l.data.end(), a.mutable_data());
    out.append(std::move(a));
  }
  return out;
}

}  // namespace

void bind_slot_executors(py::module_& m) {
  using dflash::SlotExecutor;
  using Config = dflash::SlotExecutorConfig;
  auto config =
      py::class_<Config>(m, "ExecutorConfig", "Filled by dflash_trt.runtime.ort_executor from bundle.json / engine.json.")
          .def(py::init<>())
          .def_readwrite("target_path", &Config::target_path)
          .def_readwrite("draft_context_path", &Config::draft_context_path)
          .def_readwrite("draft_block_path", &Config::draft_block_path)
          .def_readwrite("library_path", &Config::library_path)
          .def_readwrite("driver_path", &Config::driver_path)
          .def_readwrite("cuda_graphs", &Config::cuda_graphs)
          .def_readwrite("dtype", &Config::dtype)
          .def_readwrite("threads", &Config::threads)
          .def_readwrite("max_batch", &Config::max_batch)
          .def_readwrite("capacity", &Config::capacity)
          .def_readwrite("min_query_tokens", &Config::min_query_tokens)
          .def_readwrite("target_layers", &Config::target_layers)
          .def_readwrite("target_kv_heads", &Config::target_kv_heads)
          .def_readwrite("target_head_dim", &Config::target_head_dim)
          .def_readwrite("attention_layers", &Config::attention_layers)
          .def_readwrite("linear_layers", &Config::linear_layers)
          .def_readwrite("conv_dim", &Config::conv_dim)
          .def_readwrite("conv_kernel", &Config::conv_kernel)
          .def_readwrite("linear_key_heads", &Config::linear_key_heads)
          .def_readwrite("linear_value_heads", &Config::linear_value_heads)
          .def_readwrite("linear_key_head_dim", &Config::linear_key_head_dim)
          .def_readwrite("linear_value_head_dim", &Config::linear_value_head_dim)
          .def_readwrite("feature_width", &Config::feature_width)
          .def_readwrite("vocab", &Config::vocab)
          .def_readwrite("draft_layers", &Config::draft_layers)
          .def_readwrite("draft_kv_heads", &Config::draft_kv_heads)
          .def_readwrite("draft_head_dim", &Config::draft_head_dim)
          .def_readwrite("mask_token_id", &Config::mask_token_id)
          .def_readwrite("sample_drafts", &Config::sample_drafts)
          .def_readwrite("draft_vocab_size", &Config::draft_vocab_size)
          .def_readwrite("draft_vocab", &Config::draft_vocab)
          .def_readwrite("selector_top_k", &Config::selector_top_k)
          .def("validate", [](const Config& c) { c.validate("executor config"); });
  m.attr("OrtExecutorConfig") = config;  // the name before the TensorRT executor shared it

  // An _core.Executor, so _core.Scheduler takes it (and keeps it alive) like a Python one.
  py::class_<SlotExecutor, dflash::Executor>(m, "SlotExecutor",
                                             "An executor over a graph-contract-2 bundle (slot caches in place).")
      .def_property_readonly("config", &SlotExecutor::config)
      .def_property_readonly("backend_version", &SlotExecutor::backend_version)
      .def_property_readonly("target_runs", &SlotExecutor::target_runs)
      .def_property_readonly("set_up_runs", &SlotExecutor::set_up_runs,
                             "graph runs so far that paid one-time set-up (a new shape, a CUDA graph capture)")
      .def_property_readonly("target_rows", &SlotExecutor::target_rows)
      .def("place", &SlotExecutor::place, py::arg("row"))
      .def("retained", &SlotExecutor::retained, py::arg("row"), "a released row's kept positions (prefix reuse)")
      .def("retained_place", &SlotExecutor::retained_place, py::arg("row"))
      .def("keep_released", &SlotExecutor::keep_released, py::arg("on"))
      .def("forget_retained", &SlotExecutor::forget_retained)
      .def("reusable", &SlotExecutor::reusable, py::arg("row"), py::arg("match"))
      .def("reopen", &SlotExecutor::reopen, py::arg("row"), py::arg("source"), py::arg("n"))
      .def_property_readonly("host_bytes", &SlotExecutor::host_bytes)
      .def("committed", &SlotExecutor::committed, py::arg("row"))
      .def("drafted", &SlotExecutor::drafted, py::arg("row"))
      .def_property_readonly("live_rows", &SlotExecutor::live_rows)
      // The phases, callable one by one (benchmarks, tests); the scheduler calls them in C++.
      .def(
          "prefill_logits",
          [](SlotExecutor& e, const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts) {
            return as_arrays(e.prefill_logits(rows, prompts));
          },
          py::arg("rows"), py::arg("prompts"), "-> last-position logits [1, vocab] per row")
      .def("draft", &SlotExecutor::draft, py::arg("rows"), py::arg("bonus"), py::arg("block_size"),
           py::arg("sampling") = std::vector<dflash::RowSampling>{},
           "-> block_size - 1 drafts per row: the argmax, or (sample_drafts) draws keyed by `sampling` at T>0")
      .def(
          "verify_logits",
          [](SlotExecutor& e, const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks) {
            return as_arrays(e.verify_logits(rows, blocks));
          },
          py::arg("rows"), py::arg("blocks"), "-> logits [len(block), vocab] per row")
      .def("commit", &SlotExecutor::commit, py::arg("rows"), py::arg("kept"))
      .def("release", &SlotExecutor::release, py::arg("row"))
      .def("discard", &SlotExecutor::discard, py::arg("row"))
      .def("release_scratch", &SlotExecutor::release_scratch,
           "With no request live on a host device, free the phase-sized scratch -> bytes freed (a GPU keeps it).")
      .def("reserve_memory", &SlotExecutor::reserve_memory,
           "Make every slot buffer resident now (before any request): memory under load is memory at start.")
      .def(
          "logprobs",
          [](const SlotExecutor& e, size_t i) {
            py::list out;
            for (const dflash::TokenLogprob& t : e.logprobs(i)) out.append(py::make_tuple(t.token, t.logprob));
            return out;
          },
          py::arg("i"), "The last prefill's or verify's logprob entries for its i-th row: [(token, logprob)].");

  m.attr("HAS_CUDA_DEVICE") = dflash::has_cuda_device();
#ifdef DFLASH_WITH_DEVICE_DECIDE
  m.attr("HAS_DEVICE_DECIDE") = true;  // GPU executors decide tokens on the GPU (decide_kernel.cu)
#else
  m.attr("HAS_DEVICE_DECIDE") = false;
#endif
  py::class_<dflash::PyGraphExecutor, SlotExecutor>(
      m, "PyGraphExecutor", "The slot executor over graphs written in Python (runtime/torch_graphs.py), on the host or GPU 0.")
      .def(py::init<const Config&, py::object, const std::string&>(), py::arg("config"), py::arg("graphs"),
           py::arg("device") = "cpu");

#ifdef DFLASH_WITH_ORT
  m.attr("HAS_ORT_EXECUTOR") = true;
  py::class_<dflash::OrtExecutor, SlotExecutor>(m, "OrtExecutor",
                                                "The onnxruntime (CPU) executor over a slots bundle.")
      .def(py::init<const Config&>(), py::arg("config"));
#else
  m.attr("HAS_ORT_EXECUTOR") = false;
#endif
#ifdef DFLASH_WITH_TRT
  m.attr("HAS_TRT_EXECUTOR") = true;
  // engines deserialize only in the TensorRT they were built by; the executor loads libnvinfer.so.<major>
  m.attr("TRT_HEADERS_VERSION") = std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + "." +
                                  std::to_string(NV_TENSORRT_PATCH);
  py::class_<dflash::TrtExecutor, SlotExecutor>(m, "TrtExecutor",
                                                "The TensorRT (CUDA) executor over a slots-trt engine bundle.")
      .def(py::init<const Config&>(), py::arg("config"));
#else
  m.attr("HAS_TRT_EXECUTOR") = false;
#endif
}
