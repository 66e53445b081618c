// decide.h: the acceptance and sampling rules over one row's logits, written once for the host and
// the device (hd.h). The host executors call them through sampling.cpp / acceptance.cpp; the GPU
// kernel (decide_kernel.cu) runs the same functions, one CUDA block per row, so a GPU executor
// decides a row's tokens where its logits are and only (accepted, next) reach the host.
//
// Every function works in caller-owned scratch (no allocation, no exception: the callers check their
// inputs first). Two primitives differ by target, each computing a uniquely defined result: sorting
// token ids by (probability descending, id ascending), a total order, and the k-th largest score
// (with multiplicity). The rest is the same arithmetic in the same order, so host and device give
// the same tokens on the same logits, save where the device's expf rounds a probability one ulp
// apart from the host's and the uniform falls inside that ulp (about 1e-7 per draw).
#pragma once

#include <cstdint>

#include "hd.h"
#include "rng.h"
#include "sampling.h"

#ifndef __CUDA_ARCH__
#include <algorithm>
#include <cmath>
#include <functional>
#endif

namespace dflash {

// A verify row's outcome: the drafts it kept (a prefix) and the target's token after them.
struct Verdict {
  int64_t accepted = 0;
  int64_t next = -1;
};

// One row of a GPU decision (decide_kernel.cu), as the executor uploads it.
struct DecideRow {
  int64_t first = 0;       // its first logits row
  int64_t num_drafts = 0;  // 0: sample one token (a prefill's last position)
  int64_t drafts = 0;      // where its drafts start in the drafts array
  SamplingParams sampling;
  uint64_t stream = 0;
  uint32_t position = 0;   // the sequence position of the first token decided
};

namespace decide_detail {

DFLASH_HD inline bool is_nan(float x) { return x != x; }

DFLASH_HD inline float exp_of(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}

// The total order of a sort by probability: higher first, equal probabilities by token id.
DFLASH_HD inline bool before(const float* p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

DFLASH_HD inline void sift_down(int32_t* order, int64_t root, int64_t n, const float* p) {
  // a heap whose root is the *last* in `before` order, so popping roots fills the array from the back
  for (;;) {
    int64_t child = 2 * root + 1;
    if (child >= n) return;
    if (child + 1 < n && before(p, order[child], order[child + 1])) ++child;  // the later child
    if (!before(p, order[root], order[child])) return;
    const int32_t t = order[root];
    order[root] = order[child];
    order[child] = t;
    root = child;
  }
}

// order[0..n) sorted by `before` over p by heap sort: the device's sort (no allocation, one thread),
// compiled for the host too so that tests hold it to the total order where no GPU runs.
DFLASH_HD inline void heap_sort_by_probability(int32_t* order, int64_t n, const float* p) {
  for (int64_t i = n / 2 - 1; i >= 0; --i) sift_down(order, i, n, p);
  for (int64_t end = n - 1; end > 0; --end) {
    const int32_t t = order[0];
    order[0] = order[end];
    order[end] = t;
    sift_down(order, 0, end, p);
  }
}

// order[0..n) sorted by `before` over p.
DFLASH_HD inline void sort_by_probability(int32_t* order, int64_t n, const float* p) {
#ifdef __CUDA_ARCH__
  heap_sort_by_probability(order, n, p);
#else
  std::sort(order, order + n, [p](int32_t a, int32_t b) { return before(p, a, b); });
#endif
}

// The k-th largest of scores[0..vocab) counted with multiplicity (1 <= k <= vocab); `order` is scratch.
DFLASH_HD inline float kth_largest(const float* scores, int64_t vocab, int64_t k, int32_t* order) {
#ifdef __CUDA_ARCH__
  for (int64_t i = 0; i < vocab; ++i) order[i] = int32_t(i);
  sort_by_probability(order, vocab, scores);
  return scores[order[k - 1]];
#else
  // order's memory holds floats here: the same size per element
  static_assert(sizeof(float) == sizeof(int32_t), "scratch reuse");
  float* copy = reinterpret_cast<float*>(order);
  std::copy(scores, scores + vocab, copy);
  std::nth_element(copy, copy + (k - 1), copy + vocab, std::greater<float>());
  return copy[k - 1];
#endif
}

}  // namespace decide_detail

// First token index of the maximum; a NaN counts as the maximum (torch.argmax's rules).
DFLASH_HD inline int64_t argmax_row(const float* row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (decide_detail::is_nan(row[i])) return i;
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// probs = softmax(logits / T) cut to the top-k, then to the top-p nucleus, renormalised (sampling.h
// states the rules). Needs temperature > 0. Scratch: `order` [vocab].
DFLASH_HD inline void probs_row(const float* logits, int64_t vocab, const SamplingParams& params, float* probs,
                                int32_t* order) {
  using namespace decide_detail;
  // scores = logits / T in float32, as the oracle divides a float tensor by a Python float
  const float temperature = float(params.temperature);
  for (int64_t i = 0; i < vocab; ++i) probs[i] = logits[i] / temperature;
  if (params.top_k > 0 && params.top_k < vocab) {  // keep every score >= the k-th largest (ties stay)
    const float kth = kth_largest(probs, vocab, params.top_k, order);
    for (int64_t i = 0; i < vocab; ++i)
      if (probs[i] < kth) probs[i] = -__builtin_huge_valf();
  }
  float top = probs[0];
  for (int64_t i = 1; i < vocab; ++i) top = probs[i] > top ? probs[i] : top;
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    probs[i] = exp_of(probs[i] - top);
    total += probs[i];
  }
  const float inv = float(1.0 / total);
  for (int64_t i = 0; i < vocab; ++i) probs[i] *= inv;
  if (params.top_p >= 1.0) return;
  for (int64_t i = 0; i < vocab; ++i) order[i] = int32_t(i);
  sort_by_probability(order, vocab, probs);
  // The oracle's arithmetic: cumsum accumulated in double and stored as float32, the token's own
  // mass subtracted in float32, compared with top_p rounded to float32. The first always stays.
  const float threshold = float(params.top_p);
  double running = 0.0, kept_mass = 0.0;
  int64_t kept = 0;
  for (; kept < vocab; ++kept) {
    const float p = probs[order[kept]];
    running += p;
    const float mass_before = float(running) - p;
    if (!(mass_before < threshold)) break;
    kept_mass += p;
  }
  for (int64_t j = kept; j < vocab; ++j) probs[order[j]] = 0.0f;
  const float scale = float(1.0 / kept_mass);
  for (int64_t j = 0; j < kept; ++j) probs[order[j]] *= scale;
}

// Inverse-CDF draw with uniform u in [0, 1) from a probability row (need not be exactly normalised:
// u is scaled by the row's own total, so float rounding cannot run off the end); never a token of
// probability 0. The row must have positive total.
DFLASH_HD inline int64_t draw_row(const float* probs, int64_t vocab, double u) {
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i];
  const double target = u * total;
  double running = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    running += probs[i];
    last = i;
    if (running > target) return i;
  }
  return last;
}

// The target's token at `position` from one logits row: argmax, or a draw (scratch: probs, order [vocab]).
DFLASH_HD inline int64_t sample_row(const float* logits, int64_t vocab, const SamplingParams& params,
                                    uint64_t stream, uint32_t position, float* probs, int32_t* order) {
  if (params.greedy()) return argmax_row(logits, vocab);
  probs_row(logits, vocab, params, probs, order);
  return draw_row(probs, vocab, uniform(params.seed, stream, position, kCategoricalDraw));
}

// A verify block's decision over logits [num_drafts + 1, vocab] (acceptance.h states the rules:
// greedy prefix match, or sample-then-compare): drafts are kept while each equals the target's own
// token at its position; `next` is the target's token at the first position not kept. Drafts must
// be inside the vocabulary (the callers check).
DFLASH_HD inline Verdict verdict_rows(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                                      const SamplingParams& params, uint64_t stream, uint32_t position, float* probs,
                                      int32_t* order) {
  for (int64_t j = 0;; ++j) {  // returns at j == num_drafts (the bonus) at the latest
    const int64_t token =
        sample_row(logits + j * vocab, vocab, params, stream, position + uint32_t(j), probs, order);
    if (j == num_drafts || token != drafts[j]) return {j, token};
  }
}

// A greedy verify row's decision from its positions' argmaxes (the GPU takes them in parallel first):
// the same prefix rule as verdict_rows.
DFLASH_HD inline Verdict greedy_verdict(const int64_t* drafts, int64_t num_drafts, const int32_t* argmaxes) {
  for (int64_t j = 0;; ++j)
    if (j == num_drafts || argmaxes[j] != drafts[j]) return {j, argmaxes[j]};
}

}  // namespace dflash
