// slot_executor.h: the Executor over a graph-contract-2 ("slots") bundle, for any GraphBackend
// (onnxruntime: ort_executor.h; TensorRT: trt_executor.h). The backend runs graphs and owns the
// device; everything else (what a phase binds, which rows run together, what commit keeps) is here,
// once.
//
// Memory is allocated once on the backend's device: per target layer a K and a V buffer
// [max_batch, kv, C, d] and per draft layer a context K and V buffer [max_batch, dkv, C, dd]; a row
// (the scheduler's slot index) holds one slice of each, its place. Places are kept packed: a row
// starting a request takes the lowest free place, and releasing a row moves the row in the highest
// place into the one freed (a copy of its valid cache rows and states, once per finished request),
// so the live rows always fill places [0, live). With keep_released on, a released row keeps its
// place and committed rows above the live ones (a retained row), for a later request that starts
// with the same tokens (reopen): it moves down when reopened, changes places with a live row in its
// way, and is forgotten, the one released longest ago first, when a starting row finds no free place. A request may also
// start on another row's first positions (released or live): they are copied into its place. The target graph writes its new K/V rows in place:
// each cache input and its `*_out` output are bound to the same memory over a range of places, and a
// Run's range holds exactly rows of the phase (rows whose places are not adjacent run in separate
// Runs): no row outside a phase is ever computed. Committing or rolling back moves a length.
//
// Hybrid targets (Qwen3-Next, Qwen3.5) keep a K/V cache for their full-attention layers only; each
// linear-attention layer has per slot a conv state [conv_dim, K-1] (bundle dtype) and a recurrent
// state [Hv, Dk, Dv] (float32), bound read-only over the same places. The graph returns the states
// after each row's last logits row, which a prefill and a fully accepted verify copy into the slot,
// and what every fed position fed the layer (a conv input column and the recurrence's key, value,
// decay and strength: a few KiB, not a state per position); a commit that keeps part of a block
// rebuilds the states at its last kept position from the slot's (still those before the block) and
// those inputs, on the executor's device (state_rebuild.h). Rollback needs no re-feeding.
//
// The draft graphs are the portable v1 ones (they take and return only context rows). Right after
// each target Run, draft_context turns the Run's tapped features (device memory, never downloaded)
// into context rows for every fed position (a context row depends on its own position only);
// a prefill keeps its rows at once, a verify's wait for commit, which keeps the accepted ones. The
// block pass reads a packed copy of the rows' context (so its work follows the context length, not
// the capacity).
//
// Caches, features and conv states are in the bundle's dtype (float32, float16 or bfloat16; the
// host never does arithmetic on them, it only moves bytes); logits are float32. On a device that
// decides (a GPU: Device::decides), a phase's tokens are decided where its logits are and only
// verdicts are downloaded; on the host, the rules run over the logits in place.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "executor.h"
#include "graph.h"

namespace dflash {

// Filled from bundle.json (or engine.json) by dflash_trt/runtime/ort_executor.py.
struct SlotExecutorConfig {
  std::string target_path, draft_context_path, draft_block_path;  // the bundle's three graphs
  std::string library_path;  // libonnxruntime.so.<version> | libnvinfer.so.<major>
  std::string driver_path = "libcuda.so.1";  // TensorRT: the CUDA driver library (tests load a fake one)
  bool cuda_graphs = true;  // TensorRT: decode-sized runs replayed as CUDA graphs (trt_api.cpp's TrtGraph)
  std::string dtype = "float32";
  int64_t threads = 0;  // onnxruntime: intra-op threads per session; 0: its default
  int64_t max_batch = 8;
  int64_t capacity = 2048;  // C: tokens per slot in every cache
  // Rows fed per target step at least: a shorter input is padded (repeating its last token) to this
  // many query rows, whose extra K/V lands past what the row commits. onnxruntime's attention and
  // matmuls take another code path for a single query row; at 2 every step, plain or a verify, runs
  // the same kernels, so a verified block's logits are bit-identical to decoding its tokens one by
  // one (int8-quantized activations otherwise turn that path's last-bit differences into other tokens).
  int64_t min_query_tokens = 1;
  // target: every layer index is in attention_layers (a K/V slot cache) or linear_layers (hybrid
  // targets' Gated DeltaNet: a conv and a recurrent state per slot), both ascending
  int64_t target_layers = 0, target_kv_heads = 0, target_head_dim = 0;
  std::vector<int64_t> attention_layers, linear_layers;
  int64_t conv_dim = 0, conv_kernel = 0;  // conv state [conv_dim, conv_kernel - 1] (bundle dtype)
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_key_head_dim = 0, linear_value_head_dim = 0;  // float32
  int64_t feature_width = 0;  // F: the tapped layers' hidden states, concatenated
  int64_t vocab = 0;
  // drafter; none (draft_layers 0, no draft paths, feature_width 0): a target for plain decoding
  int64_t draft_layers = 0, draft_kv_heads = 0, draft_head_dim = 0;
  int64_t mask_token_id = 0;
  // The drafter-distribution rule (acceptance.h, accept_drafter): rows sampling at T>0 draw their drafts
  // from the draft block graph's `draft_logits` [rows, B-1, draft_vocab_size] (float32) and are decided
  // by it; off: drafts are the graph's argmax (point mass). A device that decides (a GPU) draws and
  // decides them there (decide_kernel.cu), others on the host. draft_vocab: each draft id's target id
  // (empty: the ids are the target's, draft_vocab_size == vocab).
  bool sample_drafts = false;
  int64_t draft_vocab_size = 0;
  std::vector<int64_t> draft_vocab;
  // A DFlash2 drafter's candidates per position (0: a DFlash drafter). Its rows draw from the selector
  // instead: `selector_scores` [rows, B-1, k, k] (position t's score of candidate j after candidate i of
  // position t-1; position 0's rows all after the anchor) and `selector_columns` [rows, B-1, k] (draft ids).
  int64_t selector_top_k = 0;

  bool has_drafter() const { return draft_layers > 0; }

  // One line (dflash::Error, naming `who`) for anything unusable, before any allocation.
  void validate(const std::string& who) const;
};

// Float32 logits rows [rows, vocab], row-major, owned: what prefill_logits / verify_logits return.
struct LogitsRows {
  int64_t rows = 0;
  int64_t vocab = 0;
  std::vector<float> data;

  const float* row(int64_t r) const {
    DFLASH_INVARIANT(r >= 0 && r < rows);
    return data.data() + r * vocab;
  }
};

class SlotExecutor : public Executor {
 public:
  // Opens the three graphs through `backend` and allocates every slot buffer on its device.
  SlotExecutor(const SlotExecutorConfig& config, std::unique_ptr<GraphBackend> backend, const std::string& who);

  std::vector<int64_t> prefill(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts,
                               const std::vector<RowSampling>& sampling) override;
  std::vector<std::vector<int64_t>> draft(const std::vector<int64_t>& rows, const std::vector<int64_t>& bonus,
                                          int64_t block_size, const std::vector<RowSampling>& sampling) override;
  std::vector<Verdict> verify(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
                              const std::vector<RowSampling>& sampling) override;
  // The same phases returning their logits instead of deciding tokens: numerics checks against a
  // reference, and benchmarks of the graphs alone (a decode step never asks for them).
  std::vector<LogitsRows> prefill_logits(const std::vector<int64_t>& rows,
                                         const std::vector<std::vector<int64_t>>& prompts);
  std::vector<LogitsRows> verify_logits(const std::vector<int64_t>& rows,
                                        const std::vector<std::vector<int64_t>>& blocks);
  void commit(const std::vector<int64_t>& rows, const std::vector<int64_t>& kept) override;
  void release(int64_t row) override;
  void discard(int64_t row) override;
  void keep_released(bool on) override;
  // Every released row gives its place back and keeps nothing (a benchmark's warm-up, reserve_memory).
  void forget_retained();
  int64_t reusable(int64_t row, int64_t match) const override;
  bool reuses_heads() const override { return conv_.empty(); }  // a hybrid target's states: all or nothing
  bool samples_drafts() const override { return config_.sample_drafts; }
  int64_t vocab() const override { return config_.vocab; }
  void reopen(int64_t row, int64_t source, int64_t n) override;
  // Writes zeros through every slot buffer (K/V caches, draft caches, linear-attention states), so
  // their memory is resident now rather than page by page as requests first fill the slots: a
  // server's memory under load is then its memory at start, and a pool the machine cannot hold
  // runs out here (the kernel stops the process at start) instead of mid-run. Only before any
  // request (it clears the slots).
  void reserve_memory();
  // With no request live on a host device: frees the scratch each phase grows to its largest shape
  // so far (logits, decisions, features, Run outputs), so an idle process holds what it held at
  // start (the slots and their requests' state are kept). A GPU keeps its scratch (captured CUDA graphs may hold its addresses). -> bytes freed.
  size_t release_scratch();
  const std::vector<TokenLogprob>& logprobs(size_t i) const override { return logprobs_.at(i); }
  const std::vector<TokenLogprob>& prompt_logprobs(size_t i) const override { return prompt_logprobs_.at(i); }

  const SlotExecutorConfig& config() const { return config_; }
  std::string backend_version() const { return backend_->version(); }
  // A live row's committed target tokens and injected draft-context tokens (tests, diagnostics).
  int64_t committed(int64_t row) const { return state(row).live ? state(row).committed : 0; }
  int64_t drafted(int64_t row) const { return state(row).live ? state(row).drafted : 0; }
  // A released row's kept positions (0: none; keep_released).
  int64_t retained(int64_t row) const { return state(row).live ? 0 : state(row).committed; }
  std::vector<int64_t> live_rows() const;  // rows holding a request (prefilled, not released)
  int64_t target_runs() const { return target_runs_; }  // target Runs so far (a phase may split)
  int64_t set_up_runs() const override { return set_up_runs_; }
  int64_t target_rows() const { return target_rows_; }  // rows those Runs fed, summed
  int64_t place(int64_t row) const { return state(row).live ? state(row).place : -1; }  // -1: the row holds no request
  int64_t retained_place(int64_t row) const { return retained(row) ? state(row).place : -1; }
  // Bytes moved between host and device memory so far (0 on a host device: onnxruntime's CPU
  // provider reads and writes the staging arrays themselves).
  uint64_t host_bytes() const { return device_.host_bytes; }

 private:
  // Row i's logits in host memory (1 row for a prefill, len(block) for a verify), valid during the call;
  // nullptr where the device decided the row instead (`Decision`).
  using LogitsSink = std::function<void(size_t, const float*)>;
  // A target phase's tokens decided on the device where the logits are (Device::decides): per row
  // its sampling, its verify block (no blocks: a prefill's one token), and where its verdict goes.
  struct Decision {
    const std::vector<int64_t>& rows;
    const std::vector<RowSampling>& sampling;
    const std::vector<std::vector<int64_t>>* blocks;
    std::vector<Verdict>& out;
    std::vector<std::vector<TokenLogprob>>& logprobs;
  };
  // `sampling` (null: the raw logits, for tests): the rows' penalties are applied before any decision
  void prefill_rows(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts,
                    const std::vector<RowSampling>* sampling, const Decision* decision, const LogitsSink& sink);
  void verify_rows(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
                   const std::vector<RowSampling>* sampling, const Decision* decision, const LogitsSink& sink);
  // The decision kernel over one Run's logits [n, r, V] for the rows `group` of `rows` (Run row k: group[k],
  // deciding from logits row decides_at[k] on).
  void decide_run(const std::vector<size_t>& group, int64_t n, int64_t r, const std::vector<int64_t>& decides_at,
                  const Decision& decision);
  struct Row {
    bool live = false;         // holds a request; not live with a place: retained (keep_released)
    int64_t place = -1;        // its slice of every slot buffer; -1: none
    int64_t committed = 0;     // target cache rows that count (the write offset of the next run)
    int64_t released_at = 0;   // a retained row: when it was released (releases_ then)
    int64_t drafted = 0;       // draft context rows kept (== committed: each Run's are injected at once)
    int64_t verify_rows = 0;
    // where the states and draft context rows of the last verify's positions lie until commit: Run
    // `verify_run` of target phase `verify_phase`, its row `verify_index` (nothing moves before commit)
    int64_t verify_phase = -1, verify_run = -1, verify_index = -1;
    // the drafter-distribution rule: the distributions its last drafts were drawn from [drafts,
    // draft_vocab_size] (empty: its drafts were the argmax), or on a device that decides, where they
    // start in draft_q_ (-1: none), how many rows, and which device draw wrote them (draft_q_ holds the
    // last draw's alone: a verify after another row group's draft would read that group's)
    std::vector<float> draft_q;
    int64_t device_q = -1, device_q_drafts = 0, device_q_draw = 0;
  };
  // One target Run's outputs a phase keeps until the next: per linear layer the states after each
  // row's last logits row [n, size] and its positions' inputs (conv [n, C, s], delta [n, s, width]),
  // per draft cache the new context rows [n, dkv, s, dd] injected from the Run's features.
  struct StateRun {
    int64_t tokens = 0;  // s
    std::vector<Buffer> conv, recurrent, conv_inputs, delta_inputs, context;
  };
  const Row& state(int64_t row) const;
  Row& state(int64_t row);
  // The target over `rows` (ascending), feeding tokens[i] after each row's committed prefix, one Run
  // per range of adjacent places, split further where a row's writes would pass its slot's end;
  // last_only: one logits row (the last token's) per row, else one per token. After each Run the
  // drafter's context rows of every fed position are computed from the Run's features, which never
  // leave the device. Calls take(i, j, logits) per row, j = its row in the Run (for the Run's outputs).
  template <typename F>
  void run_target(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& tokens, bool last_only,
                  const std::vector<RowSampling>* sampling, const Decision* decision, F&& take);
  // The penalties (penalties.h) of a Run's rows that ask for them, applied to its logits in place: on the
  // device where it decides (what crosses: each such row's history and block), else on the host array.
  void penalize_run(const std::vector<size_t>& group, int64_t r, const std::vector<int64_t>& decides_at,
                    const std::vector<RowSampling>& sampling, const std::vector<std::vector<int64_t>>& tokens,
                    bool last_only, bool on_device);
  // The prompt logprobs (RowSampling::prompt_logprobs) of a prefill Run's rows that ask, from its raw
  // logits [n, r, V] (every position's), into prompt_logprobs_; `on_device`: where the logits are
  // (Device::score), else on the host.
  void score_prompts(const std::vector<size_t>& group, int64_t r, const std::vector<std::vector<int64_t>>& tokens,
                     const std::vector<RowSampling>& sampling, bool on_device);
  void run_target_range(int64_t lo, int64_t n, int64_t s, int64_t r, bool logits_to_host);
  // Linear layer k's conv / recurrent state after Run row j's last logits row, in Run `run` of the
  // current phase (device memory).
  const char* conv_out(int64_t run, size_t k, int64_t j) const;
  const char* recurrent_out(int64_t run, size_t k, int64_t j) const;
  // The commit of rows that keep part of their block: their states rebuilt at the last kept position,
  // a device call per Run and linear layer.
  void rebuild_states(const std::vector<std::vector<RebuildRow>>& by_run);
  // Copies every linear layer's state out of (conv, recurrent) into `row`'s place (both empty: zeros).
  void set_states(int64_t row, const std::vector<const char*>& conv, const std::vector<const char*>& recurrent);
  // Gives a row starting a request the lowest place no live row holds (clear_place; `keep` as there).
  void take_place(int64_t row, int64_t keep = -1);
  // Moves live rows down until they fill places [0, live) (after a release or a reopen); a retained
  // row in the way changes places with the live row (swap_places), so it is kept.
  void pack();
  // Makes place p hold no row: a retained row there moves to a free place, one made by forgetting the
  // retained row released longest ago where none is free (the row itself, if that is it), never `keep`
  // (a reopen's source, -1: none).
  void clear_place(int64_t p, int64_t keep);
  // A retained row gives its place back and keeps nothing.
  void forget(int64_t row);
  // Moves the row in place `from` to the free place `to`: its valid target cache rows (committed and
  // a verify's pending ones), draft context rows and linear-layer states.
  void move_place(int64_t from, int64_t to);
  // Where a place's rows lie in a target (draft: false) or draft-context cache buffer: `slot` elements
  // a place, `heads` runs of positions `pitch` bytes apart, a position `dim` elements, `row` bytes.
  struct SlotLayout {
    int64_t slot, dim, heads;
    size_t pitch, row;
  };
  SlotLayout cache_layout(bool draft) const;
  // Copies the first rows of every target cache and draft context from place `from` to place `to`.
  void copy_rows(int64_t from, int64_t to, int64_t target_rows, int64_t context_rows);
  void copy_states(int64_t from, int64_t to);  // every linear layer's conv and recurrent state
  // Exchanges what places p and q hold (both held): their valid cache rows, draft context and states,
  // one cache slot at a time through swap_scratch_.
  void swap_places(int64_t p, int64_t q);
  // The Runs of a target phase (`sampling`: a prefill's, whose rows scoring their prompts run apart).
  std::vector<std::vector<size_t>> target_groups(const std::vector<int64_t>& rows,
                                                 const std::vector<std::vector<int64_t>>& tokens,
                                                 const std::vector<RowSampling>* sampling) const;
  // Query rows a target Run feeds for an input of `len` tokens (min_query_tokens pads short ones).
  int64_t fed(int64_t len) const { return std::max(len, config_.min_query_tokens); }
  // Positions per target cache slot: the capacity plus room for the padding of a full row's last step.
  int64_t slot_positions() const { return config_.capacity + config_.min_query_tokens - 1; }
  // The draft_context graph over the current Run's features [n, s, F] (positions after each Run
  // row's committed prefix, cache_lengths_) -> the Run's context outputs.
  void inject_run(int64_t n, int64_t s);
  // Copies `count` context rows of row j of Run `run` into `row`'s draft slot after what it holds.
  void keep_context(int64_t row, int64_t run, int64_t j, int64_t count);
  // The drafter-distribution rule: draws row i of the last block pass's B - 1 drafts (keyed by s) into
  // `tokens` from draft_scores_ (and selector_columns_), their distributions over the draft ids into `q`.
  void draw_drafts(int64_t i, int64_t B, const RowSampling& s, int64_t* tokens, std::vector<float>& q);
  // The same for every row of `rows` with sampled[i], on the device (Device::draw_drafts) into tokens_
  // and draft_q_, before tokens_ is downloaded.
  void draw_drafts_on_device(const std::vector<int64_t>& rows, const std::vector<bool>& sampled,
                             const std::vector<RowSampling>& sampling, int64_t B);

  SlotExecutorConfig config_;
  std::string who_;
  std::unique_ptr<GraphBackend> backend_;
  Device& device_;
  DType dtype_;
  std::unique_ptr<Graph> target_, draft_context_, draft_block_;
  std::vector<std::string> target_cache_in_, target_cache_out_, context_names_;
  std::vector<std::string> conv_in_, recurrent_in_, conv_out_names_, recurrent_out_names_;  // per linear layer
  std::vector<std::string> conv_inputs_names_, delta_inputs_names_;
  int64_t conv_size_ = 0, recurrent_size_ = 0;  // one slot's state per linear layer, in elements
  DeltaShape delta_shape_;

  std::vector<Buffer> target_kv_;  // [2 * layer + (0 key | 1 value)] -> [max_batch, kv, C, d]
  std::vector<Buffer> draft_kv_;   // [2 * layer + (0 key | 1 value)] -> [max_batch, dkv, C, dd]
  std::vector<Buffer> conv_, recurrent_;  // per linear layer: [max_batch, conv_size_ | recurrent_size_]
  std::vector<Row> rows_;
  std::vector<int64_t> row_in_;  // per place: the row holding it (live or retained), or -1
  bool keep_released_ = false;
  Buffer swap_scratch_;  // one cache slot (or state), for swap_places
  int64_t releases_ = 0;  // releases so far (the clock of Row::released_at)
  int64_t target_runs_ = 0, target_rows_ = 0, set_up_runs_ = 0;
  int64_t phase_ = 0;       // target phases (prefill or verify calls) so far
  int64_t run_ = -1;        // the Run of the current phase whose rows `take` sees
  std::vector<StateRun> state_runs_;  // the current phase's Runs (grown, never shrunk)

  // Host arrays the graphs read or write, rewritten before each Run (grown, never shrunk).
  Staged<int64_t> ids_, cache_lengths_, query_lengths_, logits_index_, positions_, lengths_, tokens_;
  Staged<float> logits_;
  // a device decision's rows (DecideRow bytes), drafts, verdicts (Verdict bytes) and scratch
  Staged<char> decide_rows_, verdicts_, decide_logprobs_, rebuild_rows_;  // rebuild: RebuildRow bytes  // logprobs: [rows, positions, 1 + kMaxLogprobs]
  std::vector<std::vector<TokenLogprob>> logprobs_;        // the last prefill's or verify's, per row
  std::vector<std::vector<TokenLogprob>> prompt_logprobs_;  // the last prefill's, per row (RowSampling)
  Staged<int64_t> decide_drafts_;
  // PenaltyRow, PenaltyEntry, int32 and uint32 (constraint masks) bytes
  Staged<char> penalty_rows_, penalty_entries_, penalty_tokens_, penalty_masks_;
  Buffer decide_probs_, decide_order_;  // float32 [rows, positions, V]; order holds int32 tokens, then ids
  // the drafter-distribution rule's inputs from the block pass: its logits [m, B-1, V'], or a DFlash2
  // selector's scores [m, B-1, k, k] and candidate columns [m, B-1, k]
  Staged<float> draft_scores_;
  Staged<int64_t> selector_columns_;
  std::vector<int32_t> draft_of_;   // a target id's draft id, -1: none (empty: the same ids)
  // on a device that decides: draft_vocab and draft_of_ (int32 bytes) in its memory, uploaded once; the
  // rows' drafts' distributions [m, B-1, draft_vocab_size] from the last draft until their verify, and
  // the draw's scratch (DFlash2: probs [m, B-1, k]; order int32 [m, B-1, max(k, draft_vocab_size)])
  Staged<int64_t> draft_vocab_device_;
  Staged<char> draft_of_device_;
  Buffer draft_q_, draft_probs_, draft_order_;
  int64_t device_draws_ = 0;        // draw_drafts_on_device calls so far
  Buffer features_;                 // the target's tapped features [n, s, F], the drafter's input
  std::vector<Buffer> context_;     // per draft cache: the rows' packed context for the block pass
};

}  // namespace dflash
