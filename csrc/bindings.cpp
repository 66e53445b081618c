// bindings.cpp: the Python face of the core (dflash_trt._core). Thin on purpose: it converts
// arrays and maps errors; every rule lives in the C++ files it calls, so each one is reachable
// from Python and testable against the Python oracle (tests/core/).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "acceptance.h"
#include "adaptive.h"
#include "cost_model.h"
#include "decide.h"
#include "errors.h"
#include "host_block.h"
#include "executor.h"
#include "metrics.h"
#include "penalties.h"
#include "rng.h"
#include "sampling.h"
#include "scheduler.h"
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

// `count` tokens' entries, per_token each -> per token [(token, logprob), ...]: its own first, then the top ones
py::list logprob_lists(const std::vector<TokenLogprob>& entries, size_t count) {
  const size_t per_token = entries.size() / count;
  py::list tokens;
  for (size_t k = 0; k < count; ++k) {
    py::list mine;
    for (size_t e = k * per_token; e < (k + 1) * per_token; ++e) mine.append(py::make_tuple(entries[e].token, entries[e].logprob));
    tokens.append(mine);
  }
  return tokens;
}

py::dict output_dict(const RequestOutput& o) {
  py::dict d;
  d["request"] = o.request;
  d["new_tokens"] = o.new_tokens;
  // none asked: no key
  if (!o.new_logprobs.empty()) d["new_logprobs"] = logprob_lists(o.new_logprobs, o.new_tokens.size());
  if (o.prompt_scored > 0) d["prompt_logprobs"] = logprob_lists(o.prompt_logprobs, o.prompt_scored);
  d["num_tokens"] = o.num_tokens;
  d["cached_tokens"] = o.cached_tokens;
  d["num_preemptions"] = o.preemptions;
  d["finish_reason"] = o.finish == Finish::kNone ? py::object(py::none()) : py::object(py::str(finish_name(o.finish)));
  if (!o.error.empty()) d["error"] = o.error;
  py::dict metrics = to_dict(o.metrics);
  auto seconds = [](const std::optional<double>& s) { return s ? py::cast(*s) : py::object(py::none()); };
  metrics["queue_time_s"] = seconds(o.timing.queue_time());
  metrics["time_to_first_token_s"] = seconds(o.timing.time_to_first_token());
  metrics["time_per_output_token_s"] = seconds(o.timing.time_per_output_token());
  metrics["e2e_latency_s"] = seconds(o.timing.e2e_latency());
  d["metrics"] = metrics;
  return d;
}

py::list cells_list(const std::vector<CostModel::Cell>& cells) {
  py::list out;
  for (const CostModel::Cell& c : cells)
    out.append(py::dict(py::arg("rows") = c.rows, py::arg("block") = c.block, py::arg("seconds") = c.seconds,
                        py::arg("count") = c.count));
  return out;
}

}  // namespace

void bind_slot_executors(py::module_& m);  // slot_bindings.cpp

namespace {

// A request's output constraint (constraint.h) written in Python: an object with
// masks(drafts, may_replace) -> (k, uint32 array [k + 1, words], the drafts to verify) and advance(tokens). The scheduler calls it during a
// step, which runs without the GIL: each call takes it, as does the last reference's release.
class PyConstraint final : public OutputConstraint {
 public:
  explicit PyConstraint(py::object impl) : impl_(std::move(impl)) {}
  ~PyConstraint() override {
    if (!Py_IsInitialized()) {  // at exit: nothing left to release it to
      impl_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  int64_t masks(std::vector<int64_t>& drafts, bool may_replace, int64_t words,
                std::vector<uint32_t>& masks) override {
    py::gil_scoped_acquire gil;
    const py::tuple result = impl_.attr("masks")(drafts, may_replace);
    const auto k = result[0].cast<int64_t>();
    const auto array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>::ensure(result[1]);
    if (!array || array.size() != (k + 1) * words)
      throw Error("a constraint's masks() gave no uint32 array of (k + 1) * " + std::to_string(words) + " words");
    masks.assign(array.data(), array.data() + array.size());
    drafts = result[2].cast<std::vector<int64_t>>();
    return k;
  }
  void advance(const std::vector<int64_t>& tokens) override {
    py::gil_scoped_acquire gil;
    impl_.attr("advance")(tokens);
  }

 private:
  py::object impl_;
};

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
  m.attr("CATEGORICAL_DRAW") = uint32_t(kCategoricalDraw);
  m.def(
      "release_host_memory",
      [] {
#if defined(__GLIBC__)
        py::gil_scoped_release unlocked;
        return malloc_trim(0) != 0;
#else
        return false;
#endif
      },
      "Hand the C library's free heap pages back to the system (glibc's malloc_trim) -> whether any went; "
      "an idle engine calls it, so memory freed after a burst of large steps does not stay resident.");

  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init([](double temperature, int64_t top_k, double top_p, uint64_t seed, int32_t logprobs,
                       double repetition_penalty, double frequency_penalty, double presence_penalty, double min_p) {
             SamplingParams p{temperature,       top_k,
                              top_p,             seed,
                              logprobs,          repetition_penalty,
                              frequency_penalty, presence_penalty,
                              min_p};
             p.validate();
             return p;
           }),
           py::kw_only(), py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("seed") = 0, py::arg("logprobs") = -1, py::arg("repetition_penalty") = 1.0,
           py::arg("frequency_penalty") = 0.0, py::arg("presence_penalty") = 0.0, py::arg("min_p") = 0.0)
      .def_readonly("temperature", &SamplingParams::temperature)
      .def_readonly("top_k", &SamplingParams::top_k)
      .def_readonly("top_p", &SamplingParams::top_p)
      .def_readonly("seed", &SamplingParams::seed)
      .def_readonly("logprobs", &SamplingParams::logprobs);

  m.def(
      "penalized_logits",
      [](const FloatArray& logits, const std::vector<std::tuple<int32_t, int32_t, bool, bool, float>>& history,
         const std::vector<int64_t>& block, const SamplingParams& params, int64_t ban, int threads,
         std::optional<py::array_t<uint32_t, py::array::c_style | py::array::forcecast>> masks) {
        params.validate();
        if (threads < 1) throw Error("threads must be >= 1");
        int64_t vocab = 0;
        const float* in = rows_of(logits, -1, &vocab);
        const int64_t positions = logits.shape(0);
        if (positions < 1 || int64_t(block.size()) < positions)
          throw Error("logits need 1 to len(block) rows, got " + std::to_string(positions));
        PenaltyHistory seen;
        for (const auto& [token, count, in_prompt, stop, bias] : history) seen[token] = {count, in_prompt, stop, bias};
        const int64_t words = (vocab + 31) / 32;
        if (masks && masks->size() != positions * words)
          throw Error("masks need [positions, ceil(vocab / 32)] = " + std::to_string(positions * words) + " words");
        std::vector<PenaltyRow> rows;
        std::vector<PenaltyEntry> entries;
        std::vector<int32_t> tokens;
        std::vector<uint32_t> mask_words;
        add_penalty_row(seen, block, positions, 0, params, ban, masks ? masks->data() : nullptr, words, rows, entries,
                        tokens, mask_words);
        FloatArray out({py::ssize_t(positions), py::ssize_t(vocab)});
        std::copy(in, in + positions * vocab, out.mutable_data());
        for (int64_t k = 0; k < positions; ++k) {
          for (int t = 0; t < threads; ++t)  // a block's threads, one after another: the kernel's strides
            penalize_position(out.mutable_data(), vocab, rows[0], k, entries.data(), tokens.data(), t, threads);
          for (int t = 0; t < threads; ++t)
            mask_position(out.mutable_data(), vocab, rows[0], k, mask_words.data(), t, threads);
          if (rows[0].min_p_cut) cut_min_p(out.mutable_data() + k * vocab, vocab, rows[0]);
        }
        return out;
      },
      py::arg("logits"), py::arg("history"), py::arg("block"), py::arg("params"), py::arg("ban") = 0,
      py::arg("threads") = 1, py::arg("masks") = py::none(),
      "logits [positions, vocab] of a verify block (block[0] the bonus) -> the rows adjusted as an executor "
      "does (penalties.h); history: (token, output count, in the prompt, a stop token, logit bias) before "
      "the block's position 0; stop tokens banned at the first `ban` positions; masks: uint32 "
      "[positions, ceil(vocab / 32)], each position's allowed tokens (constraint.h), or None.");

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
      "device_sort_order",
      [](const std::vector<float>& probs) {
        std::vector<int32_t> order(probs.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
        decide_detail::bitonic_sort<HostThreads>(order.data(), int64_t(order.size()), probs.data());
        return order;
      },
      py::arg("probs"),
      "The decision kernel's sort (decide.h's bitonic sort) run on the host: token ids by probability "
      "descending, ties by id ascending.");
  // The decision kernel's block code on `threads` host threads (host_block.h): tests compare it with the
  // host entry points above, so the block algorithm is checked where no GPU runs.
  auto block_threads = [](int threads) {
    if (threads < 1 || threads > kMaxThreads)
      throw Error("threads must be in [1, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  };
  m.def(
      "block_probs",
      [block_threads](const FloatArray& logits, const SamplingParams& params, int threads, double margin, int blocks) {
        block_threads(threads);
        if (blocks < 1 || threads % blocks != 0)
          throw Error("blocks must divide threads, got " + std::to_string(blocks) + " blocks of " + std::to_string(threads));
        params.validate();
        if (params.greedy()) throw Error("block_probs needs temperature > 0");
        int64_t vocab = 0;
        const float* in = rows_of(logits, 1, &vocab);
        FloatArray probs({py::ssize_t(vocab)});
        std::vector<int32_t> order(vocab);
        RowShared shared;
        HostBlock::run(
            threads,
            [&] { probs_row_by<HostBlock>(in, vocab, params, probs.mutable_data(), order.data(), shared, margin); },
            blocks);
        return probs;
      },
      py::arg("logits"), py::arg("params"), py::arg("threads"), py::arg("margin") = kNucleusMargin,
      py::arg("blocks") = 1,
      "logits [1, vocab] -> probs [vocab]; `margin`: the nucleus candidates' mass past top_p; `blocks`: the "
      "threads split as a cluster's blocks, each adding its radix bins apart (tests).");
  auto logprob_list = [](const std::vector<TokenLogprob>& entries) {
    py::list out;
    for (const TokenLogprob& e : entries) out.append(py::make_tuple(e.token, e.logprob));
    return out;
  };
  auto logprob_row = [](const FloatArray& logits, int64_t token, int32_t top, int64_t* vocab) {
    const float* row = rows_of(logits, 1, vocab);
    if (token < 0 || token >= *vocab || top < 0 || top > kMaxLogprobs)
      throw Error("logprobs needs a token in [0, vocab) and top in [0, " + std::to_string(kMaxLogprobs) + "]");
    return row;
  };
  m.def(
      "logprobs",
      [logprob_list, logprob_row](const FloatArray& logits, int64_t token, int32_t top) {
        int64_t vocab = 0;
        const float* row = logprob_row(logits, token, top, &vocab);
        std::vector<TokenLogprob> out(1 + top);
        std::vector<int32_t> order(vocab);
        logprobs_row(row, vocab, token, top, out.data(), order.data());
        return logprob_list(out);
      },
      py::arg("logits"), py::arg("token"), py::arg("top"),
      "logits [1, vocab] -> [(token, logprob), then the top ones]: the executors' logprobs rule.");
  m.def(
      "block_logprobs",
      [block_threads, logprob_list, logprob_row](const FloatArray& logits, int64_t token, int32_t top, int threads) {
        block_threads(threads);
        int64_t vocab = 0;
        const float* row = logprob_row(logits, token, top, &vocab);
        std::vector<TokenLogprob> out(1 + top);
        std::vector<int32_t> order(vocab);
        RowShared shared;
        HostBlock::run(threads,
                       [&] { logprobs_row_by<HostBlock>(row, vocab, token, top, out.data(), order.data(), shared); });
        return logprob_list(out);
      },
      py::arg("logits"), py::arg("token"), py::arg("top"), py::arg("threads"),
      "logprobs by the block code on `threads` host threads.");
  m.def(
      "block_accept",
      [block_threads](const std::vector<int64_t>& drafts, const FloatArray& logits, const SamplingParams& params,
                      uint64_t request, uint32_t position, int threads) {
        block_threads(threads);
        params.validate();
        int64_t vocab = 0;
        const float* rows = rows_of(logits, int64_t(drafts.size()) + 1, &vocab);
        check_drafts(drafts.data(), int64_t(drafts.size()), vocab);
        std::vector<float> probs(vocab);
        std::vector<int32_t> order(vocab);
        RowShared shared;
        Verdict verdict;
        HostBlock::run(threads, [&] {
          const Verdict mine = verdict_rows_by<HostBlock>(drafts.data(), int64_t(drafts.size()), rows, vocab, params,
                                                          request, position, probs.data(), order.data(), shared);
          if (HostBlock::id() == 0) verdict = mine;
        });
        return py::make_tuple(verdict.accepted, verdict.next);
      },
      py::arg("drafts"), py::arg("logits"), py::arg("params"), py::arg("request"), py::arg("position"),
      py::arg("threads"), "accept's decision by the block code on `threads` host threads.");
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
      "drafter_step",
      [block_threads](const FloatArray& logits, const FloatArray& draft_logits, const SamplingParams& params,
                      uint64_t request, uint32_t position, const std::vector<int64_t>& draft_vocab, int threads) {
        if (params.greedy()) throw Error("drafter_step draws drafts at temperature > 0 (greedy drafts are the argmax)");
        if (threads) block_threads(threads);
        int64_t vocab = 0, draft_vocab_size = 0;
        const float* rows = rows_of(logits, -1, &vocab);
        const int64_t num_drafts = int64_t(logits.shape(0)) - 1;
        const float* draft_rows = rows_of(draft_logits, num_drafts, &draft_vocab_size);
        if (draft_vocab.empty() ? draft_vocab_size != vocab : int64_t(draft_vocab.size()) != draft_vocab_size)
          throw Error("draft_logits must have one column per draft_vocab id (none: per target id)");
        const std::vector<int32_t> draft_of = draft_ids_of(draft_vocab, vocab, "drafter_step");
        const int32_t* of = draft_of.empty() ? nullptr : draft_of.data();
        std::vector<int64_t> drafts(num_drafts);
        std::vector<float> q(num_drafts * draft_vocab_size);
        if (threads == 0) {
          draw_block_drafts(draft_rows, num_drafts, draft_vocab_size, draft_vocab, params, request, position,
                            drafts.data(), q.data());
          const Acceptance a = accept_drafter(drafts.data(), num_drafts, rows, vocab, q.data(), draft_vocab_size, of,
                                              params, request, position);
          return py::make_tuple(drafts, int64_t(a.accepted), int64_t(a.next));
        }
        // the kernels' block code, a block per draw and per verify position as dflash_draw_drafts and
        // dflash_target_tokens launch them
        std::vector<float> p(vocab);
        std::vector<int32_t> order(std::max(vocab, draft_vocab_size));
        RowShared shared;
        auto on_block = [&](auto body) {
          int64_t out = 0;
          HostBlock::run(threads, [&] {
            const int64_t mine = body();
            if (HostBlock::id() == 0) out = mine;
          });
          return out;
        };
        for (int64_t j = 0; j < num_drafts; ++j) {
          const int64_t id = on_block([&] {
            return draft_row_by<HostBlock>(draft_rows + j * draft_vocab_size, draft_vocab_size, params, request,
                                           position + uint32_t(j), q.data() + j * draft_vocab_size, order.data(),
                                           shared);
          });
          drafts[j] = draft_vocab.empty() || id < 0 ? id : draft_vocab[id];
        }
        for (int64_t j = 0; j < num_drafts; ++j) {
          const int64_t token = on_block([&] {
            return drafter_position_by<HostBlock>(rows + j * vocab, vocab, drafts[j], q.data() + j * draft_vocab_size,
                                                  of, params, request, position + uint32_t(j), p.data(), order.data(),
                                                  shared);
          });
          if (token != kKept) return py::make_tuple(drafts, int64_t(j), int64_t(token));
        }
        const int64_t bonus = on_block([&] {
          return sample_row_by<HostBlock>(rows + num_drafts * vocab, vocab, params, request,
                                          position + uint32_t(num_drafts), p.data(), order.data(), shared);
        });
        return py::make_tuple(drafts, int64_t(num_drafts), int64_t(bonus));
      },
      py::arg("logits"), py::arg("draft_logits"), py::arg("params"), py::arg("request"), py::arg("position"),
      py::arg("draft_vocab") = std::vector<int64_t>{}, py::arg("threads") = 0,
      "The drafter-distribution rule's step as the executor runs it (T>0): drafts drawn from draft_logits [d, V'] "
      "(draft_vocab: each column's target id), decided over logits [d + 1, vocab] -> (drafts, accepted, next). "
      "threads 0: the host entry points; 1..512: the GPU kernels' block code on that many host threads.");
  m.def(
      "selector_drafts",
      [block_threads](const FloatArray& scores, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>&
                                                    columns,
                      int64_t draft_vocab_size, const SamplingParams& params, uint64_t request, uint32_t position,
                      int threads) {
        if (params.greedy()) throw Error("selector_drafts draws at temperature > 0 (greedy drafts are the walk)");
        params.validate();
        if (threads) block_threads(threads);
        if (scores.ndim() != 3 || scores.shape(1) != scores.shape(2) || columns.ndim() != 2 ||
            columns.shape(0) != scores.shape(0) || columns.shape(1) != scores.shape(1) || scores.shape(1) < 1)
          throw Error("selector_drafts needs scores [n, k, k] and columns [n, k]");
        const int64_t n = scores.shape(0), k = scores.shape(1);
        for (int64_t i = 0; i < n * k; ++i)
          if (columns.data()[i] < 0 || columns.data()[i] >= draft_vocab_size)
            throw Error("selector_drafts: a column is outside the draft vocabulary");
        std::vector<int64_t> drafts(n);
        FloatArray q({py::ssize_t(n), py::ssize_t(draft_vocab_size)});
        if (threads == 0) {
          draw_selector_drafts(scores.data(), columns.data(), n, k, draft_vocab_size, {}, params, request, position,
                               drafts.data(), q.mutable_data());
        } else {
          std::vector<float> probs(k);
          std::vector<int32_t> order(k);
          RowShared shared;
          HostBlock::run(threads, [&] {
            selector_walk_by<HostBlock>(scores.data(), columns.data(), n, k, draft_vocab_size, params, request,
                                        position, q.mutable_data(), drafts.data(), probs.data(), order.data(), shared);
          });
        }
        return py::make_tuple(drafts, q);
      },
      py::arg("scores"), py::arg("columns"), py::arg("draft_vocab_size"), py::arg("params"), py::arg("request"),
      py::arg("position"), py::arg("threads") = 0,
      "A DFlash2 selector's drafts under the drafter rule: scores [n, k, k], columns [n, k] (draft ids) -> "
      "(draft ids, q [n, draft_vocab_size]); threads as drafter_step's.");
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

  m.def("expected_tokens", &expected_tokens, py::arg("acceptance"), py::arg("block"),
        "E_B = 1 + sum_{k<B} prod_{j<=k} a_j: tokens one row commits per verify of block B.");
  m.def("choose_block", &choose_block, py::arg("acceptance"), py::arg("limits"), py::arg("verify_cost"),
        py::arg("draft_cost"),
        "The adaptive policy: B in 1..len(verify_cost) maximising committed tokens per second (csrc/adaptive.h).");
  py::class_<AcceptanceEstimate>(m, "AcceptanceEstimate")
      .def(py::init<int64_t>(), py::arg("max_drafts"))
      .def("observe", &AcceptanceEstimate::observe, py::arg("drafted"), py::arg("accepted"))
      .def("decay", &AcceptanceEstimate::decay)
      .def("acceptance", &AcceptanceEstimate::acceptance)
      .def_property_readonly_static("DECAY", [](py::object) { return AcceptanceEstimate::kDecay; });
  py::class_<CostModel>(m, "CostModel")
      .def(py::init<>())
      .def("observe", &CostModel::observe, py::arg("rows"), py::arg("block"), py::arg("seconds"))
      .def("predict", &CostModel::predict, py::arg("rows"), py::arg("block"))
      .def("cells", [](const CostModel& c) { return cells_list(c.cells()); });

  py::class_<Executor>(m, "Executor", "What the scheduler drives (csrc/executor.h): the slot executors.")
      // The deciding phases, callable one by one (tests, benchmarks); the scheduler calls them in C++.
      .def("prefill", &Executor::prefill, py::arg("rows"), py::arg("prompts"), py::arg("sampling"),
           "-> the token decided at each row's last prompt position")
      .def(
          "verify",
          [](Executor& e, const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
             const std::vector<RowSampling>& sampling) {
            std::vector<std::pair<int64_t, int64_t>> out;
            for (const Verdict& v : e.verify(rows, blocks, sampling)) out.emplace_back(v.accepted, v.next);
            return out;
          },
          py::arg("rows"), py::arg("blocks"), py::arg("sampling"), "-> (drafts kept, next token) per row");
  py::class_<RowSampling>(m, "RowSampling", "A row's sampling params, RNG stream and first decided position.")
      .def(py::init([](const SamplingParams& sampling, uint64_t stream, uint32_t position) {
             return RowSampling{sampling, stream, position};
           }),
           py::arg("sampling") = SamplingParams{}, py::arg("stream") = 0, py::arg("position") = 0)
      .def_readonly("sampling", &RowSampling::sampling)
      .def_readonly("stream", &RowSampling::stream)
      .def_readonly("position", &RowSampling::position);

  py::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(py::init([](int64_t max_batch, int64_t capacity, int64_t block_size, uint64_t engine_seed, bool adaptive,
                       int64_t max_waiting, int64_t prefill_chunk, bool prefix_reuse, int64_t prefix_wait_tokens,
                       bool by_priority) {
             return SchedulerConfig{max_batch,     capacity,     block_size,         engine_seed, adaptive, max_waiting,
                                    prefill_chunk, prefix_reuse, prefix_wait_tokens, by_priority};
           }),
           py::kw_only(), py::arg("max_batch") = 8, py::arg("capacity") = 2048, py::arg("block_size") = 4,
           py::arg("engine_seed") = 0, py::arg("adaptive") = false, py::arg("max_waiting") = -1,
           py::arg("prefill_chunk") = 0, py::arg("prefix_reuse") = true, py::arg("prefix_wait_tokens") = 128,
           py::arg("by_priority") = false)
      .def_readonly("max_batch", &SchedulerConfig::max_batch)
      .def_readonly("capacity", &SchedulerConfig::capacity)
      .def_readonly("block_size", &SchedulerConfig::block_size)
      .def_readonly("engine_seed", &SchedulerConfig::engine_seed)
      .def_readonly("adaptive", &SchedulerConfig::adaptive)
      .def_readonly("max_waiting", &SchedulerConfig::max_waiting)
      .def_readonly("prefill_chunk", &SchedulerConfig::prefill_chunk)
      .def_readonly("prefix_reuse", &SchedulerConfig::prefix_reuse)
      .def_readonly("prefix_wait_tokens", &SchedulerConfig::prefix_wait_tokens)
      .def_readonly("by_priority", &SchedulerConfig::by_priority);

  py::class_<RequestParams>(m, "RequestParams")
      .def(py::init([](int64_t max_tokens, double temperature, int64_t top_k, double top_p, py::object seed,
                       std::vector<int64_t> stop_token_ids, std::vector<int64_t> eos_token_ids, bool ignore_eos,
                       int64_t max_block, int32_t logprobs, double repetition_penalty, double frequency_penalty,
                       double presence_penalty, std::vector<std::pair<int64_t, double>> logit_bias,
                       int64_t min_tokens, double min_p, py::object constraint, int32_t prompt_logprobs,
                       int64_t priority, std::string cache_salt) {
             RequestParams p;
             p.sampling = SamplingParams{temperature,       top_k,
                                         top_p,             seed.is_none() ? 0 : seed.cast<uint64_t>(),
                                         logprobs,          repetition_penalty,
                                         frequency_penalty, presence_penalty,
                                         min_p};
             p.sampling.validate();
             p.seeded = !seed.is_none();
             p.max_tokens = max_tokens;
             p.stop_token_ids = std::move(stop_token_ids);
             p.eos_token_ids = std::move(eos_token_ids);
             p.ignore_eos = ignore_eos;
             p.max_block = max_block;
             p.logit_bias = std::move(logit_bias);
             p.min_tokens = min_tokens;
             if (!constraint.is_none()) p.constraint = std::make_shared<PyConstraint>(std::move(constraint));
             p.prompt_logprobs = prompt_logprobs;
             p.priority = priority;
             p.cache_salt = std::move(cache_salt);
             return p;
           }),
           py::kw_only(), py::arg("max_tokens") = 256, py::arg("temperature") = 0.0, py::arg("top_k") = 0,
           py::arg("top_p") = 1.0, py::arg("seed") = py::none(), py::arg("stop_token_ids") = std::vector<int64_t>{},
           py::arg("eos_token_ids") = std::vector<int64_t>{}, py::arg("ignore_eos") = false,
           py::arg("max_block") = 0, py::arg("logprobs") = -1, py::arg("repetition_penalty") = 1.0,
           py::arg("frequency_penalty") = 0.0, py::arg("presence_penalty") = 0.0,
           py::arg("logit_bias") = std::vector<std::pair<int64_t, double>>{}, py::arg("min_tokens") = 0,
           py::arg("min_p") = 0.0, py::arg("constraint") = py::none(), py::arg("prompt_logprobs") = -1,
           py::arg("priority") = 0, py::arg("cache_salt") = std::string())
      .def_readonly("max_tokens", &RequestParams::max_tokens)
      .def_readonly("max_block", &RequestParams::max_block)
      .def_readonly("seeded", &RequestParams::seeded)
      .def_readonly("priority", &RequestParams::priority)
      .def_readonly("cache_salt", &RequestParams::cache_salt);

  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init<Executor&, const SchedulerConfig&>(), py::arg("executor"), py::arg("config"),
           py::keep_alive<1, 2>())
      .def("add_request", &Scheduler::add_request, py::arg("prompt"), py::arg("params"))
      .def("abort", &Scheduler::abort, py::arg("request"))
      .def(
          "step",
          [](Scheduler& s) {
            std::vector<RequestOutput> outputs;
            {
              // Models run without the GIL: other Python threads (a server's front, clients) go on; the
              // torch backend's graphs take it back (py_graph.cpp).
              py::gil_scoped_release release;
              outputs = s.step();
            }
            py::list out;
            for (const RequestOutput& o : outputs) out.append(output_dict(o));
            return out;
          },
          "One step over every live request -> [dict(request, new_tokens, num_tokens, finish_reason, metrics)].")
      .def("seed_cost", &Scheduler::seed_cost, py::arg("phase"), py::arg("rows"), py::arg("block"),
           py::arg("seconds"), "Calibrate: one \"verify\" or \"draft\" call over rows at block took seconds.")
      .def(
          "stats",
          [](const Scheduler& s) {
            const SchedulerStats st = s.stats();
            py::dict d;
            d["adaptive"] = s.config().adaptive;
            d["max_block"] = s.config().block_size;
            py::dict seconds;
            seconds["prefill"] = st.seconds.prefill;
            seconds["draft"] = st.seconds.draft;
            seconds["verify"] = st.seconds.verify;
            seconds["commit"] = st.seconds.commit;
            seconds["step"] = st.seconds.step;
            d["seconds"] = seconds;
            d["steps"] = st.seconds.steps;
            d["prompt_tokens"] = st.prompt_tokens;
            d["cached_tokens"] = st.cached_tokens;
            d["preemptions"] = st.preemptions;
            d["last_block"] = st.last_block;
            d["steps_per_block"] = st.steps_per_block;
            d["acceptance"] = st.acceptance;
            d["verify_cost"] = cells_list(st.verify_cost);
            d["draft_cost"] = cells_list(st.draft_cost);
            return d;
          },
          "The adaptive bookkeeping: last_block, steps_per_block, acceptance a_j, timed cost cells per phase.")
      .def_property_readonly("num_running", &Scheduler::num_running)
      .def_property_readonly("num_live", &Scheduler::num_running, "num_running's earlier name")
      .def_property_readonly("num_waiting", &Scheduler::num_waiting)
      .def_property_readonly("preemptions", &Scheduler::num_preemptions,
                             "Running requests that gave their slot to one of a higher priority, so far.")
      .def_property_readonly("has_work", &Scheduler::has_work)
      .def_property_readonly("slots", &Scheduler::slots, py::return_value_policy::reference_internal);

  bind_slot_executors(m);
}
