// bindings.cpp: the Python face of the core (dflash_trt._core). Thin on purpose: it converts
// arrays and maps errors; every rule lives in the C++ files it calls, so each one is reachable
// from Python and testable against the Python oracle (tests/core/).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <string>
#include <vector>

#include "acceptance.h"
#include "errors.h"
#include "metrics.h"
#include "rng.h"
#include "sampling.h"
#include "slots.h"

namespace py = pybind11;
using namespace dflash;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// logits [rows, vocab] as a checked raw view (rows < 0: any number); a wrong shape is the caller's
// one-line mistake.
const float* rows_of(const FloatArray& logits, int64_t rows, int64_t* vocab) {
  const std::string want = rows < 0 ? "[rows, vocab]" : "[" + std::to_string(rows) + ", vocab] (drafts + 1 rows)";
  if (logits.ndim() != 2 || (rows >= 0 && logits.shape(0) != rows))
    throw Error("logits must have shape " + want + ", got " + std::to_string(logits.ndim()) + " dimensions with " +
                std::to_string(logits.ndim() ? logits.shape(0) : 0) + " rows");
  *vocab = logits.shape(1);
  if (*vocab < 1) throw Error("logits must have at least one vocabulary column");
  return logits.data();
}

py::tuple as_tuple(const Acceptance& a) { return py::make_tuple(a.accepted, a.next); }

py::dict to_dict(const SpecMetrics& m) {
  py::dict d;
  d["num_drafts"] = m.num_drafts;
  d["num_draft_tokens"] = m.num_draft_tokens;
  d["num_accepted_tokens"] = m.num_accepted_tokens;
  d["accepted_per_position"] = m.accepted_per_position;
  d["mean_acceptance_length"] = m.num_drafts ? py::cast(m.mean_acceptance_length()) : py::none();
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dflash-trt C++ runtime core: counter RNG, sampling, acceptance, KV slots, metrics";

  // Resolved once at import; deliberately never released, so the translator can run during
  // interpreter shutdown without touching a destroyed object.
  static py::handle dflash_error = py::object(py::module_::import("dflash_trt.errors").attr("DFlashError")).release();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(dflash_error.ptr(), e.what());
    } catch (const InvariantError& e) {
      PyErr_SetString(PyExc_AssertionError, e.what());
    }
  });

  m.def("philox4x32_10",
        [](std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) { return philox4x32_10(counter, key); },
        py::arg("counter"), py::arg("key"), "The raw Philox4x32-10 block: 4 counter words, 2 key words -> 4 words.");
  m.def("uniform", &uniform, py::arg("seed"), py::arg("request"), py::arg("position"), py::arg("draw"),
        "Uniform in [0, 1) (53 bits) at key (seed, request, position, draw); stateless.");
  m.attr("ACCEPT_DRAW") = uint32_t(kAcceptDraw);
  m.attr("CATEGORICAL_DRAW") = uint32_t(kCategoricalDraw);

  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init([](double temperature, int64_t top_k, double top_p, uint64_t seed) {
             SamplingParams p{temperature, top_k, top_p, seed};
             p.validate();
             return p;
           }),
           py::kw_only(), py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("seed") = 0)
      .def_readonly("temperature", &SamplingParams::temperature)
      .def_readonly("top_k", &SamplingParams::top_k)
      .def_readonly("top_p", &SamplingParams::top_p)
      .def_readonly("seed", &SamplingParams::seed);

  m.def(
      "target_probs",
      [](const FloatArray& logits, const SamplingParams& params) {
        int64_t vocab = 0;
        const float* in = rows_of(logits, -1, &vocab);
        FloatArray probs({logits.shape(0), py::ssize_t(vocab)});
        target_probs(in, logits.shape(0), vocab, params, probs.mutable_data());
        return probs;
      },
      py::arg("logits"), py::arg("params"), "logits [rows, vocab] float32 -> probs [rows, vocab].");

  m.def(
      "accept_greedy",
      [](const std::vector<int64_t>& drafts, const FloatArray& logits) {
        int64_t vocab = 0;
        const float* rows = rows_of(logits, int64_t(drafts.size()) + 1, &vocab);
        return as_tuple(accept_greedy(drafts.data(), int64_t(drafts.size()), rows, vocab));
      },
      py::arg("drafts"), py::arg("logits"), "-> (accepted, next token). logits [len(drafts) + 1, vocab].");
  m.def(
      "accept",
      [](const std::vector<int64_t>& drafts, const FloatArray& logits, const SamplingParams& params,
         uint64_t request, uint32_t position) {
        int64_t vocab = 0;
        const float* rows = rows_of(logits, int64_t(drafts.size()) + 1, &vocab);
        return as_tuple(accept(drafts.data(), int64_t(drafts.size()), rows, vocab, params, request, position));
      },
      py::arg("drafts"), py::arg("logits"), py::arg("params"), py::arg("request"), py::arg("position"),
      "Greedy at temperature 0, else point-mass rejection sampling; position = sequence position of drafts[0].");
  m.def(
      "sample",
      [](const FloatArray& logits, const SamplingParams& params, uint64_t request, uint32_t position) {
        if (logits.ndim() != 1 || logits.shape(0) < 1) throw Error("sample needs one logits row [vocab]");
        return sample(logits.data(), logits.shape(0), params, request, position);
      },
      py::arg("logits"), py::arg("params"), py::arg("request"), py::arg("position"));

  py::class_<SlotAllocator>(m, "SlotAllocator")
      .def(py::init<int64_t, int64_t>(), py::arg("num_slots"), py::arg("capacity"))
      .def("allocate", &SlotAllocator::allocate, py::arg("request"), py::arg("prompt_tokens"), py::arg("max_tokens"))
      .def("free", &SlotAllocator::free, py::arg("slot"))
      .def("reserve", &SlotAllocator::reserve, py::arg("slot"), py::arg("n"))
      .def("commit", &SlotAllocator::commit, py::arg("slot"), py::arg("keep"))
      .def("rollback", &SlotAllocator::rollback, py::arg("slot"))
      .def("length", &SlotAllocator::length, py::arg("slot"))
      .def("reserved", &SlotAllocator::reserved, py::arg("slot"))
      .def("request", &SlotAllocator::request, py::arg("slot"))
      .def_property_readonly("num_slots", &SlotAllocator::num_slots)
      .def_property_readonly("capacity", &SlotAllocator::capacity)
      .def_property_readonly("num_free", &SlotAllocator::num_free);

  py::class_<SpecMetrics>(m, "SpecMetrics")
      .def(py::init<>())
      .def("record", &SpecMetrics::record, py::arg("drafted"), py::arg("accepted"))
      .def("merge", &SpecMetrics::merge, py::arg("other"))
      .def("to_dict", &to_dict);
  m.def(
      "aggregate", [](const std::vector<SpecMetrics>& requests) { return to_dict(aggregate(requests)); },
      py::arg("requests"), "Summed counters of many requests, as a dict.");
}
