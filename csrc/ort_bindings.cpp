// ort_bindings.cpp: the onnxruntime executor's Python face (_core.OrtExecutorConfig, _core.OrtExecutor),
// and _core.HAS_ORT_EXECUTOR. Compiled in every build; the executor itself only when setup.py found
// the onnxruntime C API headers (DFLASH_WITH_ORT). dflash_trt/runtime/ort_executor.py fills the config
// from a bundle; the executor goes to _core.Scheduler like any other (it is an _core.Executor).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#ifdef DFLASH_WITH_ORT
#include "ort_executor.h"
#endif

namespace py = pybind11;

#ifdef DFLASH_WITH_ORT
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
#endif

void bind_ort_executor(py::module_& m) {
#ifdef DFLASH_WITH_ORT
  using dflash::OrtExecutor;
  using dflash::OrtExecutorConfig;
  m.attr("HAS_ORT_EXECUTOR") = true;
  py::class_<OrtExecutorConfig>(m, "OrtExecutorConfig", "Filled by dflash_trt.runtime.ort_executor from bundle.json.")
      .def(py::init<>())
      .def_readwrite("target_path", &OrtExecutorConfig::target_path)
      .def_readwrite("draft_context_path", &OrtExecutorConfig::draft_context_path)
      .def_readwrite("draft_block_path", &OrtExecutorConfig::draft_block_path)
      .def_readwrite("library_path", &OrtExecutorConfig::library_path)
      .def_readwrite("dtype", &OrtExecutorConfig::dtype)
      .def_readwrite("threads", &OrtExecutorConfig::threads)
      .def_readwrite("max_batch", &OrtExecutorConfig::max_batch)
      .def_readwrite("capacity", &OrtExecutorConfig::capacity)
      .def_readwrite("target_layers", &OrtExecutorConfig::target_layers)
      .def_readwrite("target_kv_heads", &OrtExecutorConfig::target_kv_heads)
      .def_readwrite("target_head_dim", &OrtExecutorConfig::target_head_dim)
      .def_readwrite("attention_layers", &OrtExecutorConfig::attention_layers)
      .def_readwrite("linear_layers", &OrtExecutorConfig::linear_layers)
      .def_readwrite("conv_dim", &OrtExecutorConfig::conv_dim)
      .def_readwrite("conv_kernel", &OrtExecutorConfig::conv_kernel)
      .def_readwrite("linear_value_heads", &OrtExecutorConfig::linear_value_heads)
      .def_readwrite("linear_key_head_dim", &OrtExecutorConfig::linear_key_head_dim)
      .def_readwrite("linear_value_head_dim", &OrtExecutorConfig::linear_value_head_dim)
      .def_readwrite("feature_width", &OrtExecutorConfig::feature_width)
      .def_readwrite("vocab", &OrtExecutorConfig::vocab)
      .def_readwrite("draft_layers", &OrtExecutorConfig::draft_layers)
      .def_readwrite("draft_kv_heads", &OrtExecutorConfig::draft_kv_heads)
      .def_readwrite("draft_head_dim", &OrtExecutorConfig::draft_head_dim)
      .def_readwrite("mask_token_id", &OrtExecutorConfig::mask_token_id)
      .def("validate", &OrtExecutorConfig::validate);

  // An _core.Executor, so _core.Scheduler takes it (and keeps it alive) like a Python one.
  py::class_<OrtExecutor, dflash::Executor>(m, "OrtExecutor",
                                            "The onnxruntime executor over a graph-contract-2 (slots) bundle.")
      .def(py::init<const OrtExecutorConfig&>(), py::arg("config"))
      .def_property_readonly("config", &OrtExecutor::config)
      .def_property_readonly("onnxruntime_version", &OrtExecutor::onnxruntime_version)
      .def_property_readonly("target_runs", &OrtExecutor::target_runs)
      .def("committed", &OrtExecutor::committed, py::arg("row"))
      .def("drafted", &OrtExecutor::drafted, py::arg("row"))
      // The phases, callable one by one (benchmarks, tests); the scheduler calls them in C++.
      .def(
          "prefill",
          [](OrtExecutor& e, const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts) {
            return as_arrays(e.prefill(rows, prompts));
          },
          py::arg("rows"), py::arg("prompts"), "-> last-position logits [1, vocab] per row")
      .def("draft", &OrtExecutor::draft, py::arg("rows"), py::arg("bonus"), py::arg("block_size"))
      .def(
          "verify",
          [](OrtExecutor& e, const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks) {
            return as_arrays(e.verify(rows, blocks));
          },
          py::arg("rows"), py::arg("blocks"), "-> logits [len(block), vocab] per row")
      .def("commit", &OrtExecutor::commit, py::arg("rows"), py::arg("kept"))
      .def("release", &OrtExecutor::release, py::arg("row"));
#else
  m.attr("HAS_ORT_EXECUTOR") = false;
#endif
}
