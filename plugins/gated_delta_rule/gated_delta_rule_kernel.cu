// dflash::GatedDeltaRule v1 CUDA kernels: one thread block per (batch row, value head, 32 columns of
// the state). A verify (every state kept) loops over the tokens with the state in registers; a
// prefill (the last state only) of a chunk or more takes the chunked form (gated_delta_chunks.h).
#include "gated_delta_rule/gated_delta_rule_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/convert.cuh"
#include "gated_delta_rule/gated_delta_chunks.h"

namespace dflash {
namespace {

// The state's columns (value dims) evolve independently: column j needs only k_t, q_t, g_t, beta_t
// and v_t[j]. So a block owns 32 columns, and Dv / 32 blocks share a head (more blocks for a
// batch of one). Each column is held by 4 adjacent lanes, each with every 4th row (of Dk), so the
// two sums over Dk per token (S^T k, S^T q) are 2 shuffles.
constexpr int kColumns = 32;
constexpr int kLanesPerColumn = 4;
constexpr int kThreads = kColumns * kLanesPerColumn;
constexpr int kWarps = kThreads / 32;

struct Launch {
  int64_t tokens, key_heads, value_heads, key_dim, value_dim, states_from;
};

__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One token's inputs as a thread holds them: its kLoads elements of q and k (elements threadIdx.x,
// + kThreads, ... of Dk), the head's gate and beta, and its column's value.
template <int kLoads>
struct TokenInputs {
  float q[kLoads], k[kLoads], g, beta, v;

  template <typename T>
  __device__ __forceinline__ void load(const Launch& a, const T* query, const T* key, const T* value,
                                       const float* gate, const T* betas, int64_t row, int64_t h, int64_t kh,
                                       int64_t j, bool column_ok, int64_t t) {
    const int64_t key_row = (row * a.tokens + t) * a.key_heads + kh;
    const int64_t head_row = (row * a.tokens + t) * a.value_heads + h;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int64_t i = threadIdx.x + l * kThreads;
      q[l] = i < a.key_dim ? dflash::load(query + key_row * a.key_dim + i) : 0.f;
      k[l] = i < a.key_dim ? dflash::load(key + key_row * a.key_dim + i) : 0.f;
    }
    g = __ldg(gate + head_row);
    beta = dflash::load(betas + head_row);
    v = column_ok ? dflash::load(value + head_row * a.value_dim + j) : 0.f;
  }
};

// kRows rows of Dk per thread: Dk <= kRows * kLanesPerColumn (zero-padded beyond Dk).
template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads)
    gated_delta_rule_kernel(Launch a, const T* query, const T* key, const T* value, const float* g, const T* beta,
                            const float* initial_state, T* out, float* states) {
  constexpr int kPadded = kRows * kLanesPerColumn, kLoads = (kPadded + kThreads - 1) / kThreads;
  // Double-buffered by token parity, so one barrier per token suffices: token t+1 is staged into
  // the other buffer while slower threads may still read token t's.
  __shared__ float q_s[2][kPadded], k_s[2][kPadded];
  __shared__ float2 sums_s[2][kWarps];

  const int64_t row = blockIdx.x / a.value_heads, h = blockIdx.x % a.value_heads;
  const int64_t kh = h / (a.value_heads / a.key_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = lane % kLanesPerColumn;
  const int64_t j = blockIdx.y * kColumns + warp * (32 / kLanesPerColumn) + lane / kLanesPerColumn;
  const bool column_ok = j < a.value_dim;
  const int64_t dk = a.key_dim, dv = a.value_dim;
  const int64_t first = a.states_from, kept = a.tokens - first;
  const float inv_sqrt_dk = 1.f / sqrtf(static_cast<float>(dk));

  for (int i = threadIdx.x; i < 2 * kPadded; i += kThreads) {  // padding rows stay zero
    (&q_s[0][0])[i] = 0.f;
    (&k_s[0][0])[i] = 0.f;
  }
  float state[kRows];
  const float* init = initial_state + (row * a.value_heads + h) * dk * dv;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = r * kLanesPerColumn + part;
    state[r] = column_ok && i < dk ? init[i * dv + j] : 0.f;
  }
  __syncthreads();

  // Token t + kAhead's inputs are loaded while token t is computed, from a ring of kAhead tokens'
  // registers: with only the next token in flight, a token cost a memory latency (1.3 us a token of a
  // verify on an H200, several times its arithmetic).
  constexpr int kAhead = kRows <= 32 ? 4 : 2;  // Dk = 256: its 64 state rows a thread leave room for fewer
  TokenInputs<kLoads> ring[kAhead];
#pragma unroll
  for (int u = 0; u < kAhead; ++u)
    if (u < a.tokens) ring[u].load(a, query, key, value, g, beta, row, h, kh, j, column_ok, u);
#pragma unroll 1
  for (int64_t t0 = 0; t0 < a.tokens; t0 += kAhead) {
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t t = t0 + u;
      if (t >= a.tokens) break;
      TokenInputs<kLoads>& now = ring[u];  // token t's inputs; then token t + kAhead's
      const int buf = static_cast<int>(t & 1);
      const int64_t head_row = (row * a.tokens + t) * a.value_heads + h;
      const float decay = expf(now.g), b_t = now.beta, v_j = now.v;
      float qq = 0.f, kk = 0.f;
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const int64_t i = threadIdx.x + l * kThreads;
        if (i >= dk) break;
        q_s[buf][i] = now.q[l];
        k_s[buf][i] = now.k[l];
        qq += now.q[l] * now.q[l];
        kk += now.k[l] * now.k[l];
      }
      if (t + kAhead < a.tokens) now.load(a, query, key, value, g, beta, row, h, kh, j, column_ok, t + kAhead);
      qq = warp_sum(qq);
      kk = warp_sum(kk);
      if (lane == 0) sums_s[buf][warp] = make_float2(qq, kk);
      __syncthreads();
      qq = kk = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        qq += sums_s[buf][w].x;
        kk += sums_s[buf][w].y;
      }
      const float rq = rsqrtf(qq + kGatedDeltaRuleEpsilon) * inv_sqrt_dk, rk = rsqrtf(kk + kGatedDeltaRuleEpsilon);

      // The two sums over this lane's rows in kChains running sums: one of kRows was a chain of
      // dependent multiply-adds on every token's critical path.
      constexpr int kChains = 4;
      float recalled[kChains] = {};  // (S^T k)[j], this lane's rows
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        state[r] *= decay;
        recalled[r % kChains] += state[r] * k_s[buf][r * kLanesPerColumn + part];
      }
      const float recall = (recalled[0] + recalled[1]) + (recalled[2] + recalled[3]);
      const float delta = b_t * (v_j - column_sum(recall) * rk);
      float outs[kChains] = {};
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int i = r * kLanesPerColumn + part;
        state[r] += k_s[buf][i] * rk * delta;
        outs[r % kChains] += state[r] * q_s[buf][i];
      }
      const float o = column_sum((outs[0] + outs[1]) + (outs[2] + outs[3])) * rq;
      if (column_ok && part == 0) out[head_row * dv + j] = from_float<T>(o);
      if (column_ok && t >= first) {
        float* kept_state = states + ((row * kept + t - first) * a.value_heads + h) * dk * dv;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int64_t i = r * kLanesPerColumn + part;
          if (i < dk) kept_state[i * dv + j] = state[r];
        }
      }
    }
  }
}

// gated_delta_chunks.h's policies on a CUDA block.
struct BlockThreads {
  __device__ static int id() { return threadIdx.x; }
  __device__ static int count() { return blockDim.x; }
  __device__ static void sync() { __syncthreads(); }
};

struct DeviceIo {
  template <typename T>
  __device__ static float load(const T* p) {
    return dflash::load(p);
  }
  template <typename T>
  __device__ static void store(T* p, float x) {
    *p = from_float<T>(x);
  }
};

// The chunked prefill: grid as the token loop's, delta_chunks::kThreads threads, delta_chunks::Shared
// as dynamic shared memory; `states` holds the one state kept, [b, 1, Hv, Dk, Dv].
template <typename T>
__global__ void __launch_bounds__(delta_chunks::kThreads)
    gated_delta_chunks_kernel(GatedDeltaRuleShape a, const T* query, const T* key, const T* value, const float* g,
                              const T* beta, const float* initial_state, T* out, float* states) {
  extern __shared__ float4 shared_memory[];
  auto& shared = *reinterpret_cast<delta_chunks::Shared*>(shared_memory);
  const int64_t row = blockIdx.x / a.value_heads, h = blockIdx.x % a.value_heads;
  delta_chunks::scan_block<BlockThreads, DeviceIo>(a, row, h, int64_t(blockIdx.y) * delta_chunks::kColumns, query,
                                                   key, value, g, beta, initial_state, out,
                                                   states + (row * a.value_heads + h) * a.key_dim * a.value_dim,
                                                   shared);
}

// Launches the chunked prefill where the GPU lets a block have delta_chunks::Shared; false (nothing
// launched, no error left behind) where it does not, and the token loop runs instead.
template <typename T>
bool launch_chunks(const GatedDeltaRuleShape& s, dim3 grid, cudaStream_t stream, const void* query, const void* key,
                   const void* value, const float* g, const void* beta, const float* initial_state, void* out,
                   float* states, cudaError_t* launched) {
  const auto kernel = gated_delta_chunks_kernel<T>;
  const int bytes = int(sizeof(delta_chunks::Shared));
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  kernel<<<grid, delta_chunks::kThreads, bytes, stream>>>(
      s, static_cast<const T*>(query), static_cast<const T*>(key), static_cast<const T*>(value), g,
      static_cast<const T*>(beta), initial_state, static_cast<T*>(out), states);
  *launched = cudaGetLastError();
  return true;
}

template <typename T, int kRows>
cudaError_t launch_rows(const Launch& a, dim3 grid, cudaStream_t stream, const void* query, const void* key,
                        const void* value, const float* g, const void* beta, const float* initial_state,
                        void* out, float* states) {
  gated_delta_rule_kernel<T, kRows><<<grid, kThreads, 0, stream>>>(
      a, static_cast<const T*>(query), static_cast<const T*>(key), static_cast<const T*>(value), g,
      static_cast<const T*>(beta), initial_state, static_cast<T*>(out), states);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gated_delta_rule_launch(const GatedDeltaRuleShape& s, DType dtype, const void* query, const void* key,
                                    const void* value, const float* g, const void* beta, const float* initial_state,
                                    int64_t states_from, void* out, float* states, cudaStream_t stream) {
  if (gated_delta_rule_unsupported(s, states_from) != nullptr) return cudaErrorInvalidValue;
  if (s.batch == 0) return cudaSuccess;
  const Launch a{s.tokens, s.key_heads, s.value_heads, s.key_dim, s.value_dim, states_from};
  const dim3 grid(static_cast<unsigned>(s.batch * s.value_heads),
                  static_cast<unsigned>((s.value_dim + kColumns - 1) / kColumns));
  // A prefill of a chunk or more: the chunks' products in parallel, a serial chain of tokens / kChunk.
  const bool chunked = states_from == s.tokens - 1 && s.tokens >= delta_chunks::kChunk &&
                       s.key_dim <= delta_chunks::kMaxKeyDim;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cudaError_t launched = cudaSuccess;
    if (chunked && launch_chunks<T>(s, grid, stream, query, key, value, g, beta, initial_state, out, states, &launched))
      return launched;
    // The fewest registers that hold Dk / 4 rows: Qwen3-Next's Dk = 128 takes 32 per thread.
    if (s.key_dim <= 8 * kLanesPerColumn)
      return launch_rows<T, 8>(a, grid, stream, query, key, value, g, beta, initial_state, out, states);
    if (s.key_dim <= 16 * kLanesPerColumn)
      return launch_rows<T, 16>(a, grid, stream, query, key, value, g, beta, initial_state, out, states);
    if (s.key_dim <= 32 * kLanesPerColumn)
      return launch_rows<T, 32>(a, grid, stream, query, key, value, g, beta, initial_state, out, states);
    return launch_rows<T, 64>(a, grid, stream, query, key, value, g, beta, initial_state, out, states);
  });
}

}  // namespace dflash
