// The chunked form of dflash::GatedDeltaRule, for a prefill (only the last state kept): the tokens go
// kChunk at a time, each chunk's products over its tokens run at once, and only the state is carried
// from chunk to chunk, so the serial chain is tokens / kChunk long instead of `tokens`.
//
// Written once over two policies, so the CUDA kernel (gated_delta_rule_kernel.cu: a block's threads,
// __syncthreads) and the host test (tests/plugins/cpp/test_gated_delta_chunks.cpp: host threads and a
// barrier) run the same code:
//   Threads: id(), count(), sync() (a barrier that also orders Shared's reads and writes);
//   Io:      load(const T*) -> float and store(T*, float), the storage type to float32 and back.
//
// The math is the README's recurrence rewritten per chunk (as HF's torch_chunk_gated_delta_rule does).
// With q and k normalised as the recurrence normalises them, G_i = g_0 + ... + g_i the running log
// decay inside the chunk, and S the state before it:
//   L[i][j] = beta_i (k_i . k_j) e^(G_i - G_j) for j < i;   T = (I + L)^-1 (unit lower triangular)
//   W = T diag(beta e^G) K;   U = T diag(beta) V;   V' = U - W S      (row i of V': token i's delta)
//   O = diag(e^G) Q S + M V',   M[i][j] = (q_i . k_j) e^(G_i - G_j) for j <= i, else 0
//   S <- e^(G_last) S + (diag(e^(G_last - G)) K)^T V'
// A chunk's rows past the sequence's end are zeros (k, v, beta and g): they add nothing to S and leave
// G_last at the last real token's. With g <= 0 (the models' log decay) no exponent is positive.
//
// A block carries kColumns columns of one (batch row, value head)'s state: the columns evolve apart
// (column c needs only the keys, queries, gates and column c of the values), while the chunk's L, T,
// W and M, the same for every column, are recomputed by each of the head's Dv / kColumns blocks.
// Every product is a 4 x 4 or 4 x 2 tile a thread: both operands stored with the summed index
// outermost, so each step of the sum reads four (two) consecutive floats of each.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "gated_delta_rule/gated_delta_rule_ref.h"

#include <cmath>

namespace dflash {
namespace delta_chunks {

constexpr int kChunk = 32;          // tokens a chunk
constexpr int kColumns = 32;        // state columns (value dims) a block carries
constexpr int kMaxKeyDim = 128;     // Qwen3-Next / Qwen3.5's Dk; Shared holds this many rows
constexpr int kThreads = 256;       // the CUDA block (the host test runs other counts too)
// Row pitches past a power of two: rows stay 16-byte aligned, and a warp walking down a column meets
// 8 banks, not 1 (a 4-way conflict instead of a 32-way one).
constexpr int kTokenPitch = kChunk + 4;       // rows indexed by a key dim or a token, holding kChunk tokens
constexpr int kKeyPitch = kMaxKeyDim + 4;     // rows holding a token's Dk values
constexpr int kChunkTiles = kChunk / 4, kColumnTiles = kColumns / 4;  // 4-wide tiles
constexpr int kChunkPairs = kChunk / 2, kColumnPairs = kColumns / 2;  // 2-wide tiles
constexpr int kNormParts = kThreads / kChunk;  // threads summing one token's squared norms
static_assert(2 * kNormParts <= kChunk && kChunk <= kColumns, "the norms' pieces fit Shared::qs");

// A block's working set (a CUDA block's dynamic shared memory: 100,352 bytes, within what every GPU
// from SM 8.0 on lets one block have).
struct Shared {
  float kt[kMaxKeyDim][kTokenPitch];  // K^T, normalised; then W^T
  float k[kChunk][kKeyPitch];         // K, normalised; then diag(e^(G_last - G)) K
  float qt[kMaxKeyDim][kTokenPitch];  // Q^T, normalised and scaled; then (diag(e^G) Q)^T
  float state[kMaxKeyDim][kColumns];  // S: this block's columns
  float l[kChunk][kChunk];           // L
  float tw[kChunk][kTokenPitch];     // tw[m][i] = T[i][m] beta_m e^(G_m): column m of T, scaled
  float tu[kChunk][kTokenPitch];     // tu[m][i] = T[i][m] beta_m
  float mt[kChunk][kChunk];          // M^T
  float v[kChunk][kColumns];         // V: this block's columns
  float u[kChunk][kColumns];         // U, then V'
  float qs[kChunk][kColumns];        // first the tokens' squared norms in pieces; then diag(e^G) Q S
  float decay[kChunk];               // g, then G
  float beta[kChunk];
  float q_scale[kChunk], k_scale[kChunk];
};
// 99 KiB: the most one block may have on SM 8.6, 8.9 and 12.0 (more on 8.0, 9.0 and 10.0)
static_assert(sizeof(Shared) <= 99 * 1024, "a block's shared memory must fit every GPU the library targets");

DFLASH_HOST_DEVICE inline float inverse_sqrt(float x) {
#ifdef __CUDA_ARCH__
  return rsqrtf(x);
#else
  return 1.f / std::sqrt(x);
#endif
}

template <int N>
struct Floats {
  float v[N];
};

// N = 2 or 4 consecutive floats (8- or 16-byte aligned): one load on the device.
template <int N>
DFLASH_HOST_DEVICE inline Floats<N> floats(const float* at) {
  static_assert(N == 2 || N == 4, "a float2 or a float4");
#ifdef __CUDA_ARCH__
  if constexpr (N == 4) {
    const float4 f = *reinterpret_cast<const float4*>(at);
    return {{f.x, f.y, f.z, f.w}};
  } else {
    const float2 f = *reinterpret_cast<const float2*>(at);
    return {{f.x, f.y}};
  }
#else
  Floats<N> f;
  for (int i = 0; i < N; ++i) f.v[i] = at[i];
  return f;
#endif
}

// acc[r][c] += sum over d < depth of a[d * lda + r] * b[d * ldb + c]: a 4 x C tile of A^T B, with A
// and B stored summed index first (a, b and both pitches multiples of 4 floats; b of C floats).
template <int C = 4>
DFLASH_HOST_DEVICE inline void tile(const float* a, int lda, const float* b, int ldb, int depth, float (&acc)[4][C]) {
  for (int d = 0; d < depth; ++d) {
    const Floats<4> x = floats<4>(a + d * lda);
    const Floats<C> y = floats<C>(b + d * ldb);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] += x.v[r] * y.v[c];
  }
}

// For each e = id, id + count, ... below total: put(e, fetch(e)), with kInFlight fetches issued
// before any put, so a thread waits out one memory latency per kInFlight loads, not one per load.
template <class Threads, int kInFlight, class Fetch, class Put>
DFLASH_HOST_DEVICE void in_flight(int total, Fetch fetch, Put put) {
  const int id = Threads::id(), count = Threads::count();
  for (int base = id; base < total; base += kInFlight * count) {
    decltype(fetch(0)) got[kInFlight];
    DFLASH_UNROLL_ALL
    for (int u = 0; u < kInFlight; ++u)
      if (base + u * count < total) got[u] = fetch(base + u * count);
    DFLASH_UNROLL_ALL
    for (int u = 0; u < kInFlight; ++u)
      if (base + u * count < total) put(base + u * count, got[u]);
  }
}

struct Pair {
  float first, second;
};

// One block's work: columns [column0, column0 + kColumns) of (batch row `row`, value head `h`)'s state
// over all the tokens. Writes those columns of `out` and of the state after the last token at
// `last_state` ([Dk, Dv] of float32: that head's slot of `states`). The caller has checked the shape
// (gated_delta_rule_unsupported) and Dk <= kMaxKeyDim.
template <class Threads, class Io, typename T>
DFLASH_HOST_DEVICE void scan_block(const GatedDeltaRuleShape& a, int64_t row, int64_t h, int64_t column0,
                                   const T* query, const T* key, const T* value, const float* g, const T* beta,
                                   const float* initial_state, T* out, float* last_state, Shared& s) {
  const int id = Threads::id(), count = Threads::count();
  const int64_t dk = a.key_dim, dv = a.value_dim, kh = h / (a.value_heads / a.key_heads);
  const int pad = int((dk + 3) / 4 * 4);  // rows of K^T, Q^T and S in use (zeros past Dk)
  const int key_tiles = pad / 4;
  const int columns = int(dv - column0 < kColumns ? dv - column0 : kColumns);
  const float inv_sqrt_dk = inverse_sqrt(float(dk));

  const float* init = initial_state + (row * a.value_heads + h) * dk * dv + column0;
  for (int e = id; e < pad * kColumns; e += count) {
    const int d = e / kColumns, c = e % kColumns;
    s.state[d][c] = d < dk && c < columns ? init[d * dv + c] : 0.f;
  }

  for (int64_t first = 0; first < a.tokens; first += kChunk) {
    const int n = int(a.tokens - first < kChunk ? a.tokens - first : kChunk);
    // 1. The chunk's inputs, zeros past its n tokens and past Dk; K in both layouts. (A CUDA block of
    //    kThreads has each thread's 16 keys and queries in flight at once, then its 4 values.)
    in_flight<Threads, 16>(
        kChunk * pad,
        [&](int e) {
          const int i = e / pad, d = e % pad;
          const int64_t at = ((row * a.tokens + first + i) * a.key_heads + kh) * dk + d;
          return i < n && d < dk ? Pair{Io::load(key + at), Io::load(query + at)} : Pair{0.f, 0.f};
        },
        [&](int e, Pair kq) {
          const int i = e / pad, d = e % pad;
          s.k[i][d] = kq.first;
          s.kt[d][i] = kq.first;
          s.qt[d][i] = kq.second;
        });
    in_flight<Threads, 4>(
        kChunk * kColumns,
        [&](int e) {
          const int i = e / kColumns, c = e % kColumns;
          const int64_t at = ((row * a.tokens + first + i) * a.value_heads + h) * dv + column0 + c;
          return i < n && c < columns ? Io::load(value + at) : 0.f;
        },
        [&](int e, float v) { s.v[e / kColumns][e % kColumns] = v; });
    for (int i = id; i < kChunk; i += count) {
      const int64_t at = (row * a.tokens + first + i) * a.value_heads + h;
      s.decay[i] = i < n ? g[at] : 0.f;
      s.beta[i] = i < n ? Io::load(beta + at) : 0.f;
    }
    Threads::sync();

    // 2. Each token's squared norms in kNormParts pieces of its Dk values (into qs, free until step 7:
    //    rows [0, kNormParts) for q, the next kNormParts for k), then summed a thread a token; G, the
    //    running sum of g, by thread 0 from registers.
    for (int e = id; e < kChunk * kNormParts; e += count) {
      const int i = e % kChunk, part = e / kChunk;
      float qq = 0.f, kk = 0.f;
      for (int d = part; d < pad; d += kNormParts) {
        qq += s.qt[d][i] * s.qt[d][i];
        kk += s.kt[d][i] * s.kt[d][i];
      }
      s.qs[part][i] = qq;
      s.qs[kNormParts + part][i] = kk;
    }
    if (id == 0) {
      float g_of[kChunk], running = 0.f;
      DFLASH_UNROLL_ALL
      for (int i = 0; i < kChunk; ++i) g_of[i] = s.decay[i];
      DFLASH_UNROLL_ALL
      for (int i = 0; i < kChunk; ++i) s.decay[i] = running += g_of[i];
    }
    Threads::sync();
    for (int i = id; i < kChunk; i += count) {
      float qq = 0.f, kk = 0.f;
      for (int part = 0; part < kNormParts; ++part) {
        qq += s.qs[part][i];
        kk += s.qs[kNormParts + part][i];
      }
      s.q_scale[i] = inverse_sqrt(qq + kGatedDeltaRuleEpsilon) * inv_sqrt_dk;
      s.k_scale[i] = inverse_sqrt(kk + kGatedDeltaRuleEpsilon);
    }
    Threads::sync();

    // 3. Normalised: K (both layouts) and Q^T.
    for (int e = id; e < kChunk * pad; e += count) {
      const int i = e / pad, d = e % pad;
      s.k[i][d] *= s.k_scale[i];
      s.kt[d][i] *= s.k_scale[i];
      s.qt[d][i] *= s.q_scale[i];
    }
    Threads::sync();

    // 4. L and M^T, in 4 x 2 tiles (the two products' tiles then keep a CUDA block's 256 threads busy).
    for (int job = id; job < 2 * kChunkTiles * kChunkPairs; job += count) {
      const bool is_l = job < kChunkTiles * kChunkPairs;
      const int at = job % (kChunkTiles * kChunkPairs), rt = at / kChunkPairs, ct = at % kChunkPairs;
      float acc[4][2] = {};
      // L: k_i . k_j (rows i, columns j); M^T: k_j . q_i (rows j, columns i)
      tile<2>(&s.kt[0][4 * rt], kTokenPitch, is_l ? &s.kt[0][2 * ct] : &s.qt[0][2 * ct], kTokenPitch, pad, acc);
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * rt + r, j = 2 * ct + c;
          if (is_l)
            s.l[i][j] = j < i ? s.beta[i] * expf(s.decay[i] - s.decay[j]) * acc[r][c] : 0.f;
          else  // here i is the key's token and j the query's
            s.mt[i][j] = i <= j ? expf(s.decay[j] - s.decay[i]) * acc[r][c] : 0.f;
        }
    }
    Threads::sync();

    // 5. T = (I + L)^-1, a column m a thread, by forward substitution; scaled into tw and tu.
    for (int m = id; m < kChunk; m += count) {
      float x[kChunk];
      DFLASH_UNROLL_ALL
      for (int i = 0; i < kChunk; ++i) {
        float sums[2] = {0.f, 0.f};  // two chains: the substitution is the chunk's longest serial run
        DFLASH_UNROLL_ALL
        for (int j = 0; j < i; ++j) sums[j % 2] += s.l[i][j] * x[j];
        x[i] = i < m ? 0.f : i == m ? 1.f : -(sums[0] + sums[1]);
      }
      const float bu = s.beta[m], bw = bu * expf(s.decay[m]);
      for (int i = 0; i < kChunk; ++i) {
        s.tu[m][i] = x[i] * bu;
        s.tw[m][i] = x[i] * bw;
      }
    }
    Threads::sync();

    // 6. W^T into kt (K^T is done with), U, and Q^T scaled by e^G.
    for (int job = id; job < key_tiles * kChunkTiles + kChunkTiles * kColumnTiles; job += count) {
      float acc[4][4] = {};
      if (job < key_tiles * kChunkTiles) {  // W^T[d][i] = sum_m k[m][d] tw[m][i]
        const int dt = job / kChunkTiles, it = job % kChunkTiles;
        tile(&s.k[0][4 * dt], kKeyPitch, &s.tw[0][4 * it], kTokenPitch, kChunk, acc);
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) s.kt[4 * dt + r][4 * it + c] = acc[r][c];
      } else {  // U[i][c] = sum_m tu[m][i] v[m][c]
        const int at = job - key_tiles * kChunkTiles, it = at / kColumnTiles, ct = at % kColumnTiles;
        tile(&s.tu[0][4 * it], kTokenPitch, &s.v[0][4 * ct], kColumns, kChunk, acc);
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) s.u[4 * it + r][4 * ct + c] = acc[r][c];
      }
    }
    for (int e = id; e < pad * kChunk; e += count) {
      const int d = e / kChunk, i = e % kChunk;
      s.qt[d][i] *= expf(s.decay[i]);
    }
    Threads::sync();

    // 7. V' = U - W S (into u) and diag(e^G) Q S, in 4 x 2 tiles; K scaled by e^(G_last - G) for the
    //    state's update.
    for (int job = id; job < 2 * kChunkTiles * kColumnPairs; job += count) {
      const bool is_w = job < kChunkTiles * kColumnPairs;
      const int at = job % (kChunkTiles * kColumnPairs), it = at / kColumnPairs, ct = at % kColumnPairs;
      float acc[4][2] = {};
      tile<2>(is_w ? &s.kt[0][4 * it] : &s.qt[0][4 * it], kTokenPitch, &s.state[0][2 * ct], kColumns, pad, acc);
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 2; ++c) {
          float& to = is_w ? s.u[4 * it + r][2 * ct + c] : s.qs[4 * it + r][2 * ct + c];
          to = is_w ? to - acc[r][c] : acc[r][c];
        }
    }
    const float last = s.decay[kChunk - 1];
    for (int e = id; e < kChunk * pad; e += count) {
      const int i = e / pad, d = e % pad;
      s.k[i][d] *= expf(last - s.decay[i]);
    }
    Threads::sync();

    // 8. O = diag(e^G) Q S + M V' for the chunk's real tokens; S <- e^(G_last) S + K^T V'.
    const float carried = expf(last);
    for (int job = id; job < kChunkTiles * kColumnTiles + key_tiles * kColumnTiles; job += count) {
      float acc[4][4] = {};
      if (job < kChunkTiles * kColumnTiles) {
        const int it = job / kColumnTiles, ct = job % kColumnTiles;
        tile(&s.mt[0][4 * it], kChunk, &s.u[0][4 * ct], kColumns, kChunk, acc);
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) {
            const int i = 4 * it + r, col = 4 * ct + c;
            if (i < n && col < columns)
              Io::store(out + ((row * a.tokens + first + i) * a.value_heads + h) * dv + column0 + col,
                        s.qs[i][col] + acc[r][c]);
          }
      } else {
        const int at = job - kChunkTiles * kColumnTiles, dt = at / kColumnTiles, ct = at % kColumnTiles;
        tile(&s.k[0][4 * dt], kKeyPitch, &s.u[0][4 * ct], kColumns, kChunk, acc);
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) {
            float& to = s.state[4 * dt + r][4 * ct + c];
            to = carried * to + acc[r][c];
          }
      }
    }
    Threads::sync();
  }

  for (int e = id; e < dk * kColumns; e += count) {
    const int d = e / kColumns, c = e % kColumns;
    if (c < columns) last_state[d * dv + column0 + c] = s.state[d][c];
  }
}

}  // namespace delta_chunks
}  // namespace dflash
