// decide.h: the acceptance and sampling rules over one row's logits, written once for the host and
// the device (hd.h). The host executors call them through sampling.cpp / acceptance.cpp; the GPU
// kernels (decide_kernel.cu) run the same functions with a CUDA block's threads, so a GPU executor
// decides a row's tokens where its logits are and only (accepted, next) reach the host.
//
// A sampled row's work is written once against a `Threads` policy: HostThreads (one thread, the host)
// or decide_kernel.cu's BlockThreads (a block, __syncthreads, shared-memory atomics). Every step's
// result is fixed whatever the thread count: the k-th largest score by radix passes over the scores'
// bits; the nucleus's end by sorting (probability descending, id ascending: a total order) only the
// tokens near it, which radix passes over the probabilities find; and every double sum over a fixed
// partition (kChunks contiguous chunks of the vocabulary or of the sorted candidates, each summed in
// index order, then the chunks in order). So host and device give the same tokens on the same logits,
// save where the device's expf rounds a probability one ulp apart from the host's and the uniform
// falls inside that ulp (about 1e-7 a draw), and where the nucleus's cumulative mass lands within a
// double's rounding of top_p (the tokens sure to stay are summed apart from the walk, and which tokens
// count as sure rests on approximate radix sums: far rarer still).
//
// Work happens in caller-owned scratch (no allocation, no exception: the callers check their inputs).
#pragma once

#include <cstdint>
#include <type_traits>

#include "hd.h"
#include "rng.h"
#include "sampling.h"

#ifndef __CUDA_ARCH__
#include <algorithm>
#include <cmath>
#endif

namespace dflash {

// What a verify position decided, when not a token: its draft is kept (drafter_position_by, a device
// position), or its logits give no token (a NaN row, or nothing left to draw): the request fails.
constexpr int64_t kKept = -1;
constexpr int64_t kNoToken = -2;

// A verify row's outcome: the drafts it kept (a prefix) and the target's token after them (kNoToken:
// none).
struct Verdict {
  int64_t accepted = 0;
  int64_t next = -1;
};

// One entry of a decided token's log-probabilities (SamplingParams::logprobs).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// One row of a GPU decision (decide_kernel.cu), as the executor uploads it.
struct DecideRow {
  int64_t first = 0;       // its first logits row
  int64_t num_drafts = 0;  // 0: sample one token (a prefill's last position)
  int64_t drafts = 0;      // where its drafts start in the drafts array
  SamplingParams sampling;
  uint64_t stream = 0;
  uint32_t position = 0;   // the sequence position of the first token decided
  // The drafter-distribution rule (a verify row at T>0 whose drafts were drawn): where its drafts'
  // distributions start in DraftQ::q ([num_drafts, draft_vocab] from there); -1: point mass. A draw
  // (dflash_draw_drafts) reads `first` as its first row of the block pass's outputs instead.
  int64_t q = -1;
};

// The drafter-distribution rule's distributions on a device: q rows over the draft ids [*, draft_vocab],
// and draft_of [vocab], a target id's draft id (-1: the drafter cannot propose it; null: the same ids).
struct DraftQ {
  float* q = nullptr;
  int64_t draft_vocab = 0;
  const int32_t* draft_of = nullptr;
};

constexpr int kChunks = 512;      // the fixed partition of a row for its double sums
constexpr double kNucleusMargin = 1e-3;  // the nucleus's candidates weigh top_p + this (probs_row_by)
constexpr double kNucleusSettled = 1e-6;  // a kept mass this far past top_p ends the nucleus (probs_row_by)
constexpr int kMaxThreads = 4096;  // the most threads a Threads policy may have (a cluster: 8 blocks of 512)
// A GPU position decided by a cluster of this many blocks (decide_kernel.cu's dflash_target_tokens_wide,
// SM 9.0 and later): a block alone is bound by its SM's issue rate over a 152k-token row.
constexpr int kDecideCluster = 8;

// What a sampled row's threads share (a CUDA block's shared memory; the host's stack).
struct RowShared {
  unsigned bins[2][256];  // radix passes: counts, or masses in fixed point (kMassScale)
  float partial[kMaxThreads];
  double chunk[kChunks];
  uint32_t prefix[2];
  double remaining[2];
  uint32_t stops[kChunks];
  float top, last_p, scale;
  double total;  // chunks_total, summed once for every thread (shared_total)
  unsigned found;
  int64_t kept, last, token;
  double kept_mass, draw_target, draw_before;
  int draw_chunk;
};

// The radix passes' bins of a policy whose threads share one RowShared (the host; a CUDA block): every
// add goes to s.bins. A cluster's blocks (decide_kernel.cu) add into bins of their own and gather them
// into s.bins once a pass, instead of one add to another SM's shared memory per run of values.
template <class Threads>
struct SharedBins {
  DFLASH_HD static unsigned (*bins(RowShared& s))[256] { return s.bins; }
  DFLASH_HD static void clear_bins(RowShared& s, int ways) {
    for (int b = Threads::id(); b < 256 * ways; b += Threads::count()) s.bins[b / 256][b % 256] = 0;
  }
  DFLASH_HD static void gather_bins(RowShared&, int) {}  // callers sync after it
};

// One thread: the host. A policy's worker() numbers the threads that walk the fixed chunks (the
// loops over kChunks): id() here; a cluster interleaves its blocks so the walks spread over its SMs.
struct HostThreads : SharedBins<HostThreads> {
  DFLASH_HD static int id() { return 0; }
  DFLASH_HD static int worker() { return 0; }
  DFLASH_HD static int count() { return 1; }
  DFLASH_HD static void sync() {}
  DFLASH_HD static unsigned add(unsigned* at, unsigned value) {
    const unsigned old = *at;
    *at += value;
    return old;
  }
  static void sort(int32_t* order, int64_t n, const float* p);  // std::sort by `before` (below)
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

DFLASH_HD inline double log_of(double x) {
#ifdef __CUDA_ARCH__
  return log(x);
#else
  return std::log(x);
#endif
}

// The total order of a sort by probability: higher first, equal probabilities by token id.
DFLASH_HD inline bool before(const float* p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

// A float's bits as an unsigned key that orders as the float does (-inf lowest, +inf highest).
DFLASH_HD inline uint32_t order_key(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

DFLASH_HD inline float from_order_key(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float x;
  __builtin_memcpy(&x, &u, sizeof x);
  return x;
}

DFLASH_HD inline int64_t chunk_start(int64_t vocab, int c) { return vocab * c / kChunks; }

// A block alone over a 152k-token row is bound by memory latency, not bandwidth: a loop that waits on
// each load took ~90 us a pass on an H200, ~40 us with 8 loads in flight. So a thread's loads are
// issued kLoadsInFlight at a time, each of four floats (16 bytes) where the row allows.
constexpr int kLoadsInFlight = 8;

struct Quad {
  float v[4];
};

DFLASH_HD inline Quad load_quad(const float* at) {
#ifdef __CUDA_ARCH__
  const float4 q = *reinterpret_cast<const float4*>(at);
  return {{q.x, q.y, q.z, q.w}};
#else
  return {{at[0], at[1], at[2], at[3]}};
#endif
}

DFLASH_HD inline void store_quad(float* at, const Quad& q) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<float4*>(at) = make_float4(q.v[0], q.v[1], q.v[2], q.v[3]);
#else
  for (int k = 0; k < 4; ++k) at[k] = q.v[k];
#endif
}

DFLASH_HD inline bool quad_aligned(const float* at) { return reinterpret_cast<uintptr_t>(at) % 16 == 0; }

// One chunk [begin, end) of values, walked by one thread in index order: body(i, values[i]), whose result
// values[i] becomes where values is writable (a map), is called for its effect where it is const (a sum).
// The thread's neighbours walk chunks a few hundred values away, so each of its loads touches a cache
// line of its own: the aligned middle is loaded (and stored) four values at a time, a quarter of the
// loads. The order, and so every sum the body takes, is the scalar walk's.
template <class T, class Body>
DFLASH_HD void walk_chunk(T* values, int64_t begin, int64_t end, Body body) {
  constexpr bool kStore = !std::is_const_v<T>;
  const auto apply = [&](int64_t i, float& value) {
    if constexpr (kStore) value = body(i, value);
    else body(i, value);
  };
  const auto single = [&](int64_t i) {
    float value = values[i];
    apply(i, value);
    if constexpr (kStore) values[i] = value;
  };
  int64_t i = begin;
  for (; i < end && !quad_aligned(values + i); ++i) single(i);
  DFLASH_UNROLL(4)
  for (; i + 4 <= end; i += 4) {
    Quad q = load_quad(values + i);
    for (int k = 0; k < 4; ++k) apply(i + k, q.v[k]);
    if constexpr (kStore) store_quad(values + i, q);
  }
  for (; i < end; ++i) single(i);
}

// body(i, values[i]) once for each i of this thread's share of [0, n): interleaved groups of four
// (where values is 16-byte aligned and n a multiple of 4: a GPU row of a 151,936 or 248,320-token
// vocabulary), else single values, strided by the thread count; each thread's i ascending. The values
// are loaded kLoadsInFlight loads at a time before the body runs on them.
template <class Threads, class Body>
DFLASH_HD void strided(const float* values, int64_t n, Body body) {
  const int64_t stride = Threads::count();
  if (n % 4 == 0 && reinterpret_cast<uintptr_t>(values) % 16 == 0) {
    const int64_t quads = n / 4;
    for (int64_t base = Threads::id(); base < quads; base += stride * kLoadsInFlight) {
      Quad loaded[kLoadsInFlight];
      DFLASH_UNROLL(8)
      for (int u = 0; u < kLoadsInFlight; ++u)
        if (base + u * stride < quads) loaded[u] = load_quad(values + 4 * (base + u * stride));
      DFLASH_UNROLL(8)
      for (int u = 0; u < kLoadsInFlight; ++u)
        if (base + u * stride < quads)
          for (int k = 0; k < 4; ++k) body(4 * (base + u * stride) + k, loaded[u].v[k]);
    }
    return;
  }
  for (int64_t base = Threads::id(); base < n; base += stride * kLoadsInFlight) {
    float loaded[kLoadsInFlight];
    DFLASH_UNROLL(8)
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t i = base + u * stride;
      loaded[u] = i < n ? values[i] : 0.0f;
    }
    DFLASH_UNROLL(8)
    for (int u = 0; u < kLoadsInFlight; ++u)
      if (base + u * stride < n) body(base + u * stride, loaded[u]);
  }
}

// A bin's probability mass in the radix passes: a 32-bit fixed-point count, so that threads add to it
// with the GPU's native shared-memory integer atomics (a double's is a compare-and-swap loop, and a
// near-flat row's values crowd a few bins). Each add rounds by at most 2^-32, so a pass over a
// vocabulary of n tokens is off by at most n * 2^-32 (4e-5 at 152k): far inside kNucleusMargin.
constexpr double kMassScale = 2147483648.0;  // 2^31: a whole row's mass (<= 1) fits in 32 bits

// Radix passes over the keys of values[0..vocab), 8 bits at a time from the top: for each need[w], the
// key whose `weight` (count or probability mass) from the top reaches need[w], with multiplicity.
// Weighted by count (mass false) it is the need-th largest value; by mass (values: probabilities
// summing to about 1), the smallest value v such that the values >= v weigh at least `need`, to within
// the fixed-point rounding above (used with a margin, and the caller checks the outcome). Ways
// selections share each pass over the values (the nucleus's two bounds: half the passes).
template <class Threads, int Ways>
DFLASH_HD void radix_select_ways(const float* values, int64_t vocab, const double (&need)[Ways], bool mass,
                                 float (&out)[Ways], RowShared& s) {
  static_assert(Ways >= 1 && Ways <= 2, "RowShared holds two selections' bins");
  if (Threads::id() == 0)
    for (int w = 0; w < Ways; ++w) {
      s.prefix[w] = 0;
      s.remaining[w] = need[w];
    }
  for (int shift = 24; shift >= 0; shift -= 8) {
    Threads::clear_bins(s, Ways);
    Threads::sync();
    unsigned (*bins)[256] = Threads::bins(s);
    const uint32_t high = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    // A thread adds a run of its values that share a bin at once: a near-flat row puts nearly every
    // value in one bin, and one shared-memory atomic per value serialised the whole block on it.
    uint32_t prefix[Ways];
    unsigned run_bin[Ways];
    double run[Ways];
    for (int w = 0; w < Ways; ++w) {
      prefix[w] = s.prefix[w] & high;
      run_bin[w] = 256;
      run[w] = 0.0;
    }
    auto flush = [&](int w) {
      if (run_bin[w] < 256)
        Threads::add(&bins[w][run_bin[w]], mass ? unsigned(run[w] * kMassScale + 0.5) : unsigned(run[w]));
      run[w] = 0.0;
    };
    strided<Threads>(values, vocab, [&](int64_t, float value) {
      const uint32_t key = order_key(value);
      for (int w = 0; w < Ways; ++w) {
        if ((key & high) != prefix[w]) continue;
        const unsigned bin = (key >> shift) & 255u;
        if (bin != run_bin[w]) {
          flush(w);
          run_bin[w] = bin;
        }
        run[w] += mass ? double(value) : 1.0;
      }
    });
    for (int w = 0; w < Ways; ++w) flush(w);
    Threads::gather_bins(s, Ways);
    Threads::sync();
    if (Threads::id() == 0)
      for (int w = 0; w < Ways; ++w) {
        auto weight = [&](int bin) { return mass ? s.bins[w][bin] / kMassScale : double(s.bins[w][bin]); };
        double above = 0.0;
        int bin = 255;
        for (; bin > 0 && !(above + weight(bin) >= s.remaining[w]); --bin) above += weight(bin);
        s.remaining[w] -= above;
        s.prefix[w] |= uint32_t(bin) << shift;
      }
    Threads::sync();
  }
  for (int w = 0; w < Ways; ++w) out[w] = from_order_key(s.prefix[w]);
}

template <class Threads>
DFLASH_HD float radix_select(const float* values, int64_t vocab, double need, bool mass, RowShared& s) {
  const double needs[1] = {need};
  float out[1];
  radix_select_ways<Threads, 1>(values, vocab, needs, mass, out, s);
  return out[0];
}

// The largest of every thread's `top`, shared by every thread.
template <class Threads>
DFLASH_HD float fold_max(float top, RowShared& s) {
  s.partial[Threads::id()] = top;
  Threads::sync();
  // folded to kFold values by as many threads, then one: a cluster's 4096 values walked by one thread
  // took longer than the pass over the row
  constexpr int kFold = 64;
  const int count = Threads::count();
  if (Threads::id() < kFold && Threads::id() < count) {
    for (int t = Threads::id() + kFold; t < count; t += kFold) top = s.partial[t] > top ? s.partial[t] : top;
    s.partial[Threads::id()] = top;
  }
  Threads::sync();
  if (Threads::id() == 0) {
    for (int t = 1; t < kFold && t < count; ++t) top = s.partial[t] > top ? s.partial[t] : top;
    s.top = top;
  }
  Threads::sync();
  return s.top;
}

// The largest of values[0..vocab) (NaNs aside), shared by every thread.
template <class Threads>
DFLASH_HD float row_max(const float* values, int64_t vocab, RowShared& s) {
  float top = -__builtin_huge_valf();
  strided<Threads>(values, vocab, [&](int64_t, float value) { top = value > top ? value : top; });
  return fold_max<Threads>(top, s);
}

// s.chunk[c] = the sum over chunk c in index order (double) of the p that are > `above`, each chunk by
// one thread.
template <class Threads>
DFLASH_HD void chunk_sums(const float* p, int64_t vocab, RowShared& s, float above = -__builtin_huge_valf()) {
  for (int c = Threads::worker(); c < kChunks; c += Threads::count()) {
    double sum = 0.0;
    walk_chunk(p, chunk_start(vocab, c), chunk_start(vocab, c + 1),
               [&](int64_t, float value) { sum += value > above ? value : 0.0f; });
    s.chunk[c] = sum;
  }
  Threads::sync();
}

DFLASH_HD inline double chunks_total(const RowShared& s) {
  double total = 0.0;
  for (int c = 0; c < kChunks; ++c) total += s.chunk[c];
  return total;
}

// chunks_total for every thread: summed by one, read by all (each thread walking the chunks of a
// cluster's shared memory itself cost more than the pass that filled them). Called after the chunks'
// sync, and every thread reads it before the next chunk pass's sync, so one slot serves every call.
template <class Threads>
DFLASH_HD double shared_total(RowShared& s) {
  if (Threads::id() == 0) s.total = chunks_total(s);
  Threads::sync();
  return s.total;
}

// order[0..n) sorted by `before` over p: the flip form of bitonic sort (every comparator puts the
// earlier at the lower index), so positions past n act as "last" padding and are never touched.
template <class Threads>
DFLASH_HD void bitonic_sort(int32_t* order, int64_t n, const float* p) {
  int64_t size = 1;
  while (size < n) size <<= 1;
  for (int64_t k = 2; k <= size; k <<= 1) {
    for (int64_t half = k / 2; half > 0; half >>= 1) {
      for (int64_t t = Threads::id(); t < size / 2; t += Threads::count()) {
        const int64_t i = (t / half) * 2 * half + (t % half);
        const int64_t j = half == k / 2 ? (i ^ (k - 1)) : i + half;  // the flip, then half-cleaners
        if (j < n && before(p, order[j], order[i])) {
          const int32_t swap = order[i];
          order[i] = order[j];
          order[j] = swap;
        }
      }
      Threads::sync();
    }
  }
}

// The nucleus's end among candidates order[0..n) sorted by `before`, after tokens of mass `base` that
// stay whatever their order, in the oracle's arithmetic: cumsum accumulated in double and stored as
// float32, the token's own mass subtracted in float32, compared with top_p rounded to float32; the
// first token of the row always stays. Returns how many candidates stay; s.kept_mass = base + theirs.
// The walk is split into kChunks fixed pieces of [0, n), each walked by one thread from its prefix, so
// every thread count computes the same sums (one thread walking a near-flat row's 150k candidates
// took milliseconds on a GPU).
template <class Threads>
DFLASH_HD int64_t nucleus_by(const float* p, const int32_t* order, int64_t n, double base, float threshold,
                             RowShared& s) {
  for (int c = Threads::worker(); c < kChunks; c += Threads::count()) {
    double sum = 0.0;
    DFLASH_UNROLL(8)
    for (int64_t i = chunk_start(n, c), end = chunk_start(n, c + 1); i < end; ++i) sum += p[order[i]];
    s.chunk[c] = sum;
  }
  Threads::sync();
  if (Threads::id() == 0) {  // each chunk's sum -> the running total before it
    double running = base;
    for (int c = 0; c < kChunks; ++c) {
      const double here = s.chunk[c];
      s.chunk[c] = running;
      running += here;
    }
  }
  Threads::sync();
  for (int c = Threads::worker(); c < kChunks; c += Threads::count()) {  // -> the mass kept and where it ends
    double running = s.chunk[c], kept = running;
    int64_t i = chunk_start(n, c);
    for (const int64_t end = chunk_start(n, c + 1); i < end; ++i) {
      const float q = p[order[i]];
      running += q;
      if (!(float(running) - q < threshold)) break;
      kept = running;
    }
    s.chunk[c] = kept;
    s.stops[c] = uint32_t(i);
  }
  Threads::sync();
  if (Threads::id() == 0) {
    int c = 0;
    while (c < kChunks - 1 && int64_t(s.stops[c]) == chunk_start(n, c + 1)) ++c;
    s.kept = s.stops[c];
    s.kept_mass = s.chunk[c];
  }
  Threads::sync();
  return s.kept;
}

// order[0..n) = the tokens whose value is in [floor, ceiling], sorted by `before` over values; returns n.
template <class Threads>
DFLASH_HD int64_t sorted_between(const float* values, int64_t vocab, float floor, float ceiling, int32_t* order,
                                 RowShared& s) {
  if (Threads::id() == 0) s.found = 0;
  Threads::sync();
  strided<Threads>(values, vocab, [&](int64_t i, float value) {
    if (value >= floor && value <= ceiling) order[Threads::add(&s.found, 1u)] = int32_t(i);
  });
  Threads::sync();
  const int64_t n = s.found;
  Threads::sort(order, n, values);
  return n;
}

}  // namespace decide_detail

// First token index of the maximum (torch.argmax's rules), kNoToken for a row with a NaN (torch.argmax
// takes the first NaN: a token no model meant).
DFLASH_HD inline int64_t argmax_row(const float* row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (decide_detail::is_nan(row[i])) return kNoToken;
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// probs = softmax(logits / T) cut to the top-k, then to the top-p nucleus, renormalised (sampling.h
// states the rules). Needs temperature > 0. Scratch: `order` [vocab].
template <class Threads>
DFLASH_HD void probs_row_by(const float* logits, int64_t vocab, const SamplingParams& params, float* probs,
                            int32_t* order, RowShared& s, double margin = kNucleusMargin) {
  using namespace decide_detail;
  // scores = logits / T in float32, as the oracle divides a float tensor by a Python float; their
  // largest taken in the same pass (a top-k cut below keeps it)
  const float temperature = float(params.temperature);
  float mine = -__builtin_huge_valf();
  strided<Threads>(logits, vocab, [&](int64_t i, float logit) {
    const float score = logit / temperature;
    probs[i] = score;
    mine = score > mine ? score : mine;
  });
  float top = fold_max<Threads>(mine, s);  // its first barrier: every score is written
  if (top == __builtin_huge_valf()) {
    // logits / T overflowed (a temperature near 0, or an infinite logit): the distribution's limit as
    // T -> 0+, an equal share to each largest logit. Any other logit is at least a float's step below
    // it, which this small a T turns into a share that underflows to 0.
    const float largest = row_max<Threads>(logits, vocab, s);
    strided<Threads>(logits, vocab, [&](int64_t i, float logit) {
      probs[i] = logit == largest ? 0.0f : -__builtin_huge_valf();
    });
    Threads::sync();
    top = 0.0f;
  }
  if (params.top_k > 0 && params.top_k < vocab) {  // keep every score >= the k-th largest (ties stay)
    const float kth = radix_select<Threads>(probs, vocab, double(params.top_k), false, s);
    strided<Threads>(probs, vocab, [&](int64_t i, float score) {
      if (score < kth) probs[i] = -__builtin_huge_valf();
    });
    Threads::sync();
  }
  for (int c = Threads::worker(); c < kChunks; c += Threads::count()) {  // exp and its sum, chunk by chunk
    double sum = 0.0;
    walk_chunk(probs, chunk_start(vocab, c), chunk_start(vocab, c + 1), [&](int64_t, float score) {
      const float p = exp_of(score - top);
      sum += p;
      return p;
    });
    s.chunk[c] = sum;
  }
  Threads::sync();
  const float inv = float(1.0 / shared_total<Threads>(s));
  strided<Threads>(probs, vocab, [&](int64_t i, float p) { probs[i] = p * inv; });
  Threads::sync();
  if (params.top_p >= 1.0) return;
  // The nucleus is a prefix of the row sorted by `before`, and only its end needs the sort. Tokens
  // above `ceiling` (where the top mass is still short of top_p by the margin) all stay, whatever
  // their order: their mass is summed over the fixed chunks. The end lies among the candidates from
  // `floor` (where the top mass passes top_p by the margin) to the ceiling: sorted, and walked on from
  // that mass. The margin is far above the radix passes' rounding; with none (or a negative one, in
  // tests) there is no ceiling. Should the walk take every candidate short of top_p (the floor was
  // too high: a negative margin), it goes on over every token up to the ceiling.
  const double need_ceiling = params.top_p - margin, need_floor = params.top_p + margin;
  const bool has_ceiling = need_ceiling > 0.0 && need_ceiling < need_floor, has_floor = need_floor < 1.0;
  float ceiling = __builtin_huge_valf(), floor = 0.0f;
  if (has_ceiling && has_floor) {
    const double needs[2] = {need_ceiling, need_floor};
    float bounds[2];
    radix_select_ways<Threads, 2>(probs, vocab, needs, true, bounds, s);
    ceiling = bounds[0];
    floor = bounds[1];
  } else if (has_ceiling) {
    ceiling = radix_select<Threads>(probs, vocab, need_ceiling, true, s);
  } else if (has_floor) {
    floor = radix_select<Threads>(probs, vocab, need_floor, true, s);
  }
  chunk_sums<Threads>(probs, vocab, s, ceiling);
  const double above = shared_total<Threads>(s);
  Threads::sync();  // every thread has read s.chunk before the walk rewrites it
  const float threshold = float(params.top_p);
  for (;;) {
    const int64_t candidates = sorted_between<Threads>(probs, vocab, floor, ceiling, order, s);
    const int64_t kept = nucleus_by<Threads>(probs, order, candidates, above, threshold, s);
    // The walk ended among the candidates, or took them all with a mass so far past top_p that the
    // next token (below the floor) would fail the test whatever its probability (a float's rounding of
    // the running mass is ~1e-7): the usual case when one token alone holds top_p.
    if (kept < candidates || floor == 0.0f || s.kept_mass >= double(threshold) + kNucleusSettled) {
      if (Threads::id() == 0) {
        s.last = order[kept - 1];
        s.last_p = probs[s.last];
        s.scale = float(1.0 / s.kept_mass);
      }
      Threads::sync();
      break;
    }
    floor = 0.0f;
  }
  // a token stays iff it is not after the last kept one in the sort's order
  const float last_p = s.last_p, scale = s.scale;
  const int64_t last = s.last;
  strided<Threads>(probs, vocab, [&](int64_t i, float p) {
    probs[i] = (p > last_p || (p == last_p && i <= last)) ? p * scale : 0.0f;
  });
  Threads::sync();
}

// Inverse-CDF draw with uniform u in [0, 1) from a probability row (need not be exactly normalised:
// u is scaled by the row's own total, so float rounding cannot run off the end); never a token of
// probability 0. A row without positive total (NaN) draws kNoToken. Sums run over the fixed chunks: the
// chunk where the running total passes u * total is found from the chunks' sums, then walked token by token.
template <class Threads>
DFLASH_HD int64_t draw_row_by(const float* probs, int64_t vocab, double u, RowShared& s) {
  using namespace decide_detail;
  chunk_sums<Threads>(probs, vocab, s);
  if (Threads::id() == 0) {  // the first chunk whose running total passes the target
    s.draw_target = u * chunks_total(s);
    double before_chunk = 0.0;
    int c = 0;
    for (; c < kChunks && !(before_chunk + s.chunk[c] > s.draw_target); ++c) before_chunk += s.chunk[c];
    s.draw_chunk = c;
    s.draw_before = before_chunk;
  }
  Threads::sync();
  // that chunk's values staged in shared memory by every thread at once: one thread walking global
  // memory would wait on each load in turn
  const int c = s.draw_chunk;
  const int64_t begin = c < kChunks ? chunk_start(vocab, c) : 0;
  const int64_t size = c < kChunks ? chunk_start(vocab, c + 1) - begin : 0;
  const bool staged = size <= kMaxThreads;
  if (staged)
    for (int64_t i = Threads::id(); i < size; i += Threads::count()) s.partial[i] = probs[begin + i];
  Threads::sync();
  if (Threads::id() == 0) {
    const float* values = staged ? s.partial : probs + begin;
    double running = s.draw_before;
    int64_t token = -1;
    for (int64_t i = 0; i < size; ++i) {
      if (values[i] <= 0.0f) continue;
      running += values[i];
      token = begin + i;
      if (running > s.draw_target) break;
    }
    for (int64_t i = vocab - 1; token < 0 && i >= 0; --i)  // rounding: no chunk passed the target
      if (probs[i] > 0.0f) token = i;
    s.token = token < 0 ? kNoToken : token;
  }
  Threads::sync();
  const int64_t token = s.token;
  Threads::sync();  // s.token is rewritten by the next draw
  return token;
}

// The target's token at `position` from one logits row at temperature > 0 (scratch: probs, order [vocab]).
template <class Threads>
DFLASH_HD int64_t sample_row_by(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t stream,
                                uint32_t position, float* probs, int32_t* order, RowShared& s) {
  probs_row_by<Threads>(logits, vocab, params, probs, order, s);
  return draw_row_by<Threads>(probs, vocab, uniform(params.seed, stream, position, kCategoricalDraw), s);
}

// A verify block's decision over logits [num_drafts + 1, vocab] (acceptance.h states the rules:
// greedy prefix match, or sample-then-compare): drafts are kept while each equals the target's own
// token at its position; `next` is the target's token at the first position not kept. Drafts must
// be inside the vocabulary (the callers check).
template <class Threads>
DFLASH_HD Verdict verdict_rows_by(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                                  const SamplingParams& params, uint64_t stream, uint32_t position, float* probs,
                                  int32_t* order, RowShared& s) {
  for (int64_t j = 0;; ++j) {  // returns at j == num_drafts (the bonus) at the latest
    const int64_t token =
        params.greedy() ? argmax_row(logits + j * vocab, vocab)
                        : sample_row_by<Threads>(logits + j * vocab, vocab, params, stream, position + uint32_t(j),
                                                 probs, order, s);
    if (j == num_drafts || token != drafts[j]) return {j, token};
  }
}

// The log-probabilities of `token` and of the `top` most probable tokens under one row of raw logits
// (log_softmax: the model's own distribution, before temperature and the cuts, as vLLM reports by
// default) -> out[0] (the token), out[1..top] (by logit descending, ties by id). Scratch: order [vocab].
template <class Threads>
DFLASH_HD void logprobs_row_by(const float* logits, int64_t vocab, int64_t token, int32_t top, TokenLogprob* out,
                               int32_t* order, RowShared& s) {
  using namespace decide_detail;
  const float high = row_max<Threads>(logits, vocab, s);
  for (int c = Threads::worker(); c < kChunks; c += Threads::count()) {
    double sum = 0.0;
    walk_chunk(logits, chunk_start(vocab, c), chunk_start(vocab, c + 1),
               [&](int64_t, float logit) { sum += exp_of(logit - high); });
    s.chunk[c] = sum;
  }
  Threads::sync();
  const double normaliser = double(high) + log_of(shared_total<Threads>(s));
  if (top > vocab) top = int32_t(vocab);
  if (top > 0) {  // the top ones: every logit >= the top-th largest, sorted
    const float kth = radix_select<Threads>(logits, vocab, double(top), false, s);
    sorted_between<Threads>(logits, vocab, kth, __builtin_huge_valf(), order, s);
  }
  if (Threads::id() == 0) {
    // a token outside the row (kNoToken: the logits gave none) has no logit: -inf, its request fails
    const double logit = token >= 0 && token < vocab ? double(logits[token]) : -double(__builtin_huge_valf());
    out[0] = {int32_t(token), float(logit - normaliser)};
    for (int32_t j = 0; j < top; ++j) out[1 + j] = {order[j], float(double(logits[order[j]]) - normaliser)};
  }
  Threads::sync();  // order and s are rewritten by what follows
}

// -- the drafter-distribution rule (acceptance.h states it) ---------------------------------------

// A draft at `position` drawn from one row of the drafter's logits [draft_vocab] under the request's
// temperature and cuts: its distribution q into `q` (probs_row_by), the draw with the uniform at
// (position, kDraftDraw). Scratch: order [draft_vocab].
template <class Threads>
DFLASH_HD int64_t draft_row_by(const float* draft_logits, int64_t draft_vocab, const SamplingParams& params,
                               uint64_t stream, uint32_t position, float* q, int32_t* order, RowShared& s) {
  probs_row_by<Threads>(draft_logits, draft_vocab, params, q, order, s);
  return draw_row_by<Threads>(q, draft_vocab, uniform(params.seed, stream, position, kDraftDraw), s);
}

// A DFlash2 drafter's drafts under the rule: walking from the anchor, position j's candidate is drawn
// (draft_row_by over its k scores after the candidate picked before it; position 0's rows all score
// after the anchor) from scores [n, k, k] with the candidates' draft ids columns [n, k] -> draft_ids [n];
// q [n, draft_vocab] holds each draw's distribution at its candidates' columns, 0 elsewhere.
// Scratch: probs, order [k].
template <class Threads>
DFLASH_HD void selector_walk_by(const float* scores, const int64_t* columns, int64_t n, int64_t k,
                                int64_t draft_vocab, const SamplingParams& params, uint64_t stream, uint32_t position,
                                float* q, int64_t* draft_ids, float* probs, int32_t* order, RowShared& s) {
  for (int64_t i = Threads::id(); i < n * draft_vocab; i += Threads::count()) q[i] = 0.0f;
  Threads::sync();
  int64_t before = 0;
  for (int64_t j = 0; j < n; ++j) {
    before = draft_row_by<Threads>(scores + (j * k + before) * k, k, params, stream, position + uint32_t(j), probs,
                                   order, s);
    if (Threads::id() == 0) {
      for (int64_t c = 0; c < k; ++c) q[j * draft_vocab + columns[j * k + c]] += probs[c];
      draft_ids[j] = columns[j * k + before];
    }
    Threads::sync();
  }
}

// The rule at one verify position over the target's logits row: kKept when `draft` (a target id, drawn
// from q_row [draft_vocab] over the draft ids) is kept, u * q(d) < p(d) with the uniform at (position,
// kAcceptDraw); else the token emitted there, drawn from (p - q)+ renormalised with the uniform at
// (position, kCategoricalDraw) (from p itself where (p - q)+ is 0 everywhere: p = q but for float
// rounding, where a rejection has probability 0). draft_of: DraftQ's. Scratch: p, order [vocab].
template <class Threads>
DFLASH_HD int64_t drafter_position_by(const float* logits, int64_t vocab, int64_t draft, const float* q_row,
                                      const int32_t* draft_of, const SamplingParams& params, uint64_t stream,
                                      uint32_t position, float* p, int32_t* order, RowShared& s) {
  using namespace decide_detail;
  const auto q_of = [&](int64_t token) {
    const int64_t id = draft_of ? draft_of[token] : token;
    return id < 0 ? 0.0f : q_row[id];
  };
  probs_row_by<Threads>(logits, vocab, params, p, order, s);
  if (uniform(params.seed, stream, position, kAcceptDraw) * q_of(draft) < p[draft]) return kKept;
  Threads::sync();  // every thread has read p[draft] before the residual rewrites it
  strided<Threads>(p, vocab, [&](int64_t i, float value) {
    const float residual = value - q_of(i);
    p[i] = residual > 0.0f ? residual : 0.0f;
  });
  Threads::sync();
  chunk_sums<Threads>(p, vocab, s);
  const bool empty = !(shared_total<Threads>(s) > 0.0);
  Threads::sync();  // every thread has read s.chunk before the next pass rewrites it
  if (empty) probs_row_by<Threads>(logits, vocab, params, p, order, s);
  return draw_row_by<Threads>(p, vocab, uniform(params.seed, stream, position, kCategoricalDraw), s);
}

// A verify row's decision from what each of its positions decided (the GPU decides them all in
// parallel first): tokens[j] is kKept where draft j was kept, else the token emitted there (kNoToken:
// none; j == num_drafts: the bonus). The first position not kept ends the block.
DFLASH_HD inline Verdict verdict_from_tokens(int64_t num_drafts, const int32_t* tokens) {
  for (int64_t j = 0;; ++j)
    if (j == num_drafts || tokens[j] != kKept) return {j, tokens[j]};
}

#ifndef __CUDA_ARCH__
inline void HostThreads::sort(int32_t* order, int64_t n, const float* p) {
  std::sort(order, order + n, [p](int32_t a, int32_t b) { return decide_detail::before(p, a, b); });
}

// The host's entry points: one thread, shared state on the stack.
inline void probs_row(const float* logits, int64_t vocab, const SamplingParams& params, float* probs,
                      int32_t* order) {
  RowShared s;
  probs_row_by<HostThreads>(logits, vocab, params, probs, order, s);
}

inline int64_t draw_row(const float* probs, int64_t vocab, double u) {
  RowShared s;
  return draw_row_by<HostThreads>(probs, vocab, u, s);
}

inline int64_t sample_row(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t stream,
                          uint32_t position, float* probs, int32_t* order) {
  if (params.greedy()) return argmax_row(logits, vocab);
  RowShared s;
  return sample_row_by<HostThreads>(logits, vocab, params, stream, position, probs, order, s);
}

inline void logprobs_row(const float* logits, int64_t vocab, int64_t token, int32_t top, TokenLogprob* out,
                         int32_t* order) {
  RowShared s;
  logprobs_row_by<HostThreads>(logits, vocab, token, top, out, order, s);
}

inline int64_t draft_row(const float* draft_logits, int64_t draft_vocab, const SamplingParams& params, uint64_t stream,
                         uint32_t position, float* q, int32_t* order) {
  RowShared s;
  return draft_row_by<HostThreads>(draft_logits, draft_vocab, params, stream, position, q, order, s);
}

inline void selector_walk(const float* scores, const int64_t* columns, int64_t n, int64_t k, int64_t draft_vocab,
                          const SamplingParams& params, uint64_t stream, uint32_t position, float* q,
                          int64_t* draft_ids, float* probs, int32_t* order) {
  RowShared s;
  selector_walk_by<HostThreads>(scores, columns, n, k, draft_vocab, params, stream, position, q, draft_ids, probs,
                                order, s);
}

inline int64_t drafter_position(const float* logits, int64_t vocab, int64_t draft, const float* q_row,
                                const int32_t* draft_of, const SamplingParams& params, uint64_t stream,
                                uint32_t position, float* p, int32_t* order) {
  RowShared s;
  return drafter_position_by<HostThreads>(logits, vocab, draft, q_row, draft_of, params, stream, position, p, order,
                                          s);
}

inline Verdict verdict_rows(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                            const SamplingParams& params, uint64_t stream, uint32_t position, float* probs,
                            int32_t* order) {
  RowShared s;
  return verdict_rows_by<HostThreads>(drafts, num_drafts, logits, vocab, params, stream, position, probs, order, s);
}
#endif

}  // namespace dflash
