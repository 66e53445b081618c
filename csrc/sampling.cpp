// sampling.cpp: target distribution (temperature, top-k, top-p) and inverse-CDF categorical draws.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "errors.h"

namespace dflash {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0))
    throw Error("SamplingParams.temperature must be >= 0, got " + std::to_string(temperature));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw Error("SamplingParams.top_p must be in (0, 1], got " + std::to_string(top_p));
  if (top_k < 0) throw Error("SamplingParams.top_k must be an integer >= 0, got " + std::to_string(top_k));
}

namespace {

// scores = logits / T in float32, as the oracle divides a float tensor by a Python float.
void scale(const float* logits, int64_t vocab, float temperature, float* scores) {
  for (int64_t i = 0; i < vocab; ++i) scores[i] = logits[i] / temperature;
}

void cut_top_k(float* scores, int64_t vocab, int64_t k, std::vector<float>& scratch) {
  scratch.assign(scores, scores + vocab);
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
  const float kth = scratch[k - 1];
  for (int64_t i = 0; i < vocab; ++i)
    if (scores[i] < kth) scores[i] = -std::numeric_limits<float>::infinity();
}

void softmax(const float* scores, int64_t vocab, float* probs) {
  const float top = *std::max_element(scores, scores + vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp(scores[i] - top);
    total += probs[i];
  }
  const float inv = float(1.0 / total);
  for (int64_t i = 0; i < vocab; ++i) probs[i] *= inv;
}

void cut_top_p(float* probs, int64_t vocab, double top_p, std::vector<int64_t>& order) {
  order.resize(vocab);
  std::iota(order.begin(), order.end(), int64_t{0});
  // Stable: equal probabilities stay in token-id order, so the result is reproducible.
  std::stable_sort(order.begin(), order.end(), [probs](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  // The oracle's arithmetic: cumsum accumulated in double and stored as float32, the token's own
  // mass subtracted in float32, compared with top_p rounded to float32.
  const float threshold = float(top_p);
  double running = 0.0;
  double kept_mass = 0.0;
  int64_t kept = 0;
  for (; kept < vocab; ++kept) {
    const float p = probs[order[kept]];
    running += p;
    const float before = float(running) - p;
    if (!(before < threshold)) break;
    kept_mass += p;
  }
  for (int64_t j = kept; j < vocab; ++j) probs[order[j]] = 0.0f;
  const float inv = float(1.0 / kept_mass);
  for (int64_t j = 0; j < kept; ++j) probs[order[j]] *= inv;
}

}  // namespace

void target_probs(const float* logits, int64_t rows, int64_t vocab, const SamplingParams& params, float* probs) {
  params.validate();
  if (params.greedy()) throw Error("target_probs needs temperature > 0 (temperature 0 is greedy: use argmax)");
  DFLASH_INVARIANT(rows >= 0 && vocab > 0);
  std::vector<float> scores(vocab), scratch;
  std::vector<int64_t> order;
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = logits + r * vocab;
    float* out = probs + r * vocab;
    scale(in, vocab, float(params.temperature), scores.data());
    if (params.top_k > 0 && params.top_k < vocab) cut_top_k(scores.data(), vocab, params.top_k, scratch);
    softmax(scores.data(), vocab, out);
    if (params.top_p < 1.0) cut_top_p(out, vocab, params.top_p, order);
  }
}

int64_t argmax(const float* row, int64_t vocab) {
  DFLASH_INVARIANT(vocab > 0);
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(row[i])) return i;  // torch.argmax treats NaN as the maximum
    if (row[i] > row[best]) best = i;
  }
  return best;
}

int64_t draw_categorical(const float* probs, int64_t vocab, double u) {
  DFLASH_INVARIANT(vocab > 0 && u >= 0.0 && u < 1.0);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i];
  DFLASH_INVARIANT(total > 0.0);
  // Scaling u by the row's own total (not assuming 1) keeps float rounding from running off the end.
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

}  // namespace dflash
