// GPU parity of the CUDA kernels against their CPU reference twins (plugins/*/*_ref.h): random
// inputs (never zeros), several shapes, float32 / float16 / bfloat16. Inputs are rounded to the
// dtype first and the reference runs on those rounded values in float32, so the gap measures the
// kernel alone: summation order, plus one rounding of each output to the dtype.
// Exit status 77 (ctest: skipped) when no CUDA device is visible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "block_attention/block_attention_kernel.h"
#include "gated_delta_rule/gated_delta_rule_kernel.h"
#include "inject_kv/inject_kv_kernel.h"
#include "moe/moe_kernel.h"

namespace {

using dflash::DType;

int g_failures = 0;

// Tolerance |got - want| <= tol * (1 + |want|): outputs are O(1); float16 and bfloat16 allow a
// few units in the last place of the final rounding (2^-11 and 2^-8 relative).
double tolerance(DType dtype) { return dtype == DType::kFloat32 ? 1e-4 : dtype == DType::kFloat16 ? 2e-3 : 1.6e-2; }
const char* name(DType dtype) {
  return dtype == DType::kFloat32 ? "float32" : dtype == DType::kFloat16 ? "float16" : "bfloat16";
}

// Host values rounded to `dtype` (kept as float for the reference) and their device copy.
struct Tensor {
  std::vector<float> host;
  void* device = nullptr;
  Tensor(std::vector<float> values, DType dtype) : host(std::move(values)) {
    const size_t size = dflash::dtype_size(dtype);
    std::vector<unsigned char> bytes(host.size() * size);
    for (size_t i = 0; i < host.size(); ++i) {
      if (dtype == DType::kFloat16) {
        const __half h = __float2half_rn(host[i]);
        host[i] = __half2float(h);
        std::memcpy(&bytes[i * size], &h, size);
      } else if (dtype == DType::kBFloat16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(host[i]);
        host[i] = __bfloat162float(h);
        std::memcpy(&bytes[i * size], &h, size);
      } else {
        std::memcpy(&bytes[i * size], &host[i], size);
      }
    }
    cudaMalloc(&device, bytes.size() + 1);
    cudaMemcpy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  ~Tensor() { cudaFree(device); }
};

std::vector<float> read_back(const void* device, size_t count, DType dtype) {
  const size_t size = dflash::dtype_size(dtype);
  std::vector<unsigned char> bytes(count * size);
  cudaMemcpy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost);
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kFloat16) {
      __half h;
      std::memcpy(&h, &bytes[i * size], size);
      out[i] = __half2float(h);
    } else if (dtype == DType::kBFloat16) {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[i * size], size);
      out[i] = __bfloat162float(h);
    } else {
      std::memcpy(&out[i], &bytes[i * size], size);
    }
  }
  return out;
}

std::vector<float> normal(size_t count, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> out(count);
  for (float& x : out) x = dist(rng);
  return out;
}

void compare(const char* what, const std::vector<float>& got, const std::vector<float>& want, DType dtype) {
  double worst = 0.0;
  bool finite = true;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
    finite = finite && std::isfinite(err);
    if (err > worst) worst = err;
  }
  const bool ok = finite && worst <= tolerance(dtype);
  if (!ok) ++g_failures;
  std::printf("%s %-72s %-8s max scaled error %.2e%s (tolerance %.1e)\n", ok ? "ok  " : "FAIL", what, name(dtype),
              worst, finite ? "" : ", non-finite values", tolerance(dtype));
}

void inject_kv_case(int64_t b, int64_t n, int64_t hidden, int64_t kv, int64_t d, DType dtype) {
  std::mt19937 rng(static_cast<unsigned>(b * 1000 + n * 10 + d));
  const dflash::InjectKVShape s{b, n, hidden, kv, d};
  Tensor x(normal(b * n * hidden, 1.f, rng), dtype);
  Tensor wk(normal(kv * d * hidden, 1.f / std::sqrt(float(hidden)), rng), dtype);
  Tensor wv(normal(kv * d * hidden, 1.f / std::sqrt(float(hidden)), rng), dtype);
  std::vector<float> gamma(d), angles(b * n * d), cos_v(b * n * d), sin_v(b * n * d);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (float& g : gamma) g = 0.5f + unit(rng);
  for (int64_t r = 0; r < b * n; ++r)
    for (int64_t j = 0; j < d / 2; ++j) {
      const float angle = 6.f * unit(rng);
      cos_v[r * d + j] = cos_v[r * d + j + d / 2] = std::cos(angle);
      sin_v[r * d + j] = sin_v[r * d + j + d / 2] = std::sin(angle);
    }
  Tensor norm(gamma, dtype), cos_t(cos_v, dtype), sin_t(sin_v, dtype);
  const size_t out_count = b * kv * n * d;
  void *k_out, *v_out, *workspace;
  cudaMalloc(&k_out, out_count * dflash::dtype_size(dtype) + 1);
  cudaMalloc(&v_out, out_count * dflash::dtype_size(dtype) + 1);
  cudaMalloc(&workspace, dflash::inject_kv_workspace_size(s) + 1);
  const cudaError_t launched =
      dflash::inject_kv_launch(s, dtype, x.device, wk.device, wv.device, norm.device, cos_t.device, sin_t.device, 1e-6f,
                               workspace, k_out, v_out, nullptr);
  const cudaError_t done = cudaDeviceSynchronize();
  std::vector<float> k_want(out_count), v_want(out_count);
  dflash::inject_kv_ref(s, x.host.data(), wk.host.data(), wv.host.data(), norm.host.data(), cos_t.host.data(),
                        sin_t.host.data(), 1e-6f, k_want.data(), v_want.data());
  char what[128];
  std::snprintf(what, sizeof what, "InjectKV b=%ld n=%ld H=%ld kv=%ld d=%ld", long(b), long(n), long(hidden), long(kv),
                long(d));
  if (launched != cudaSuccess || done != cudaSuccess) {
    ++g_failures;
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(launched != cudaSuccess ? launched : done));
  } else {
    compare((std::string(what) + " k").c_str(), read_back(k_out, out_count, dtype), k_want, dtype);
    compare((std::string(what) + " v").c_str(), read_back(v_out, out_count, dtype), v_want, dtype);
  }
  cudaFree(k_out);
  cudaFree(v_out);
  cudaFree(workspace);
}

void block_attention_case(int64_t b, int64_t heads, int64_t kv, int64_t n, int64_t c, int64_t d,
                          std::vector<int64_t> lengths, bool causal, int64_t window, DType dtype) {
  std::mt19937 rng(static_cast<unsigned>(heads * 100 + n * 10 + c + d));
  const dflash::BlockAttentionShape s{b, heads, kv, n, c, d};
  Tensor q(normal(b * heads * n * d, 1.f, rng), dtype);
  Tensor kc(normal(b * kv * c * d, 1.f, rng), dtype), vc(normal(b * kv * c * d, 1.f, rng), dtype);
  Tensor kb(normal(b * kv * n * d, 1.f, rng), dtype), vb(normal(b * kv * n * d, 1.f, rng), dtype);
  void *lens, *out, *workspace;
  cudaMalloc(&lens, b * sizeof(int64_t));
  cudaMemcpy(lens, lengths.data(), b * sizeof(int64_t), cudaMemcpyHostToDevice);
  const size_t out_count = b * heads * n * d;
  cudaMalloc(&out, out_count * dflash::dtype_size(dtype) + 1);
  cudaMalloc(&workspace, dflash::block_attention_workspace_size(s) + 1);
  const float scale = 1.f / std::sqrt(float(d));
  const cudaError_t launched =
      dflash::block_attention_launch(s, dtype, q.device, kc.device, vc.device, kb.device, vb.device,
                                     static_cast<const int64_t*>(lens), scale, causal, window, workspace, out, nullptr);
  const cudaError_t done = cudaDeviceSynchronize();
  std::vector<float> want(out_count);
  dflash::block_attention_ref(s, q.host.data(), kc.host.data(), vc.host.data(), kb.host.data(), vb.host.data(),
                              lengths.data(), scale, causal, window, want.data());
  char what[128];
  std::snprintf(what, sizeof what, "BlockAttention b=%ld h=%ld kv=%ld n=%ld C=%ld d=%ld causal=%d window=%ld", long(b),
                long(heads), long(kv), long(n), long(c), long(d), int(causal), long(window));
  if (launched != cudaSuccess || done != cudaSuccess) {
    ++g_failures;
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(launched != cudaSuccess ? launched : done));
  } else {
    compare(what, read_back(out, out_count, dtype), want, dtype);
  }
  cudaFree(lens);
  cudaFree(out);
  cudaFree(workspace);
}

// g (log decay, negative), beta in (0, 1) and the initial state as a model feeds them; q, k, v and
// beta rounded to `dtype`, g and the states float32 (so the states use float32's tolerance).
void gated_delta_rule_case(int64_t b, int64_t s, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int64_t states_from,
                           DType dtype) {
  std::mt19937 rng(static_cast<unsigned>(s * 100 + hv * 10 + dk + dv));
  const dflash::GatedDeltaRuleShape shape{b, s, hk, hv, dk, dv};
  std::vector<float> gate = normal(b * s * hv, 1.f, rng), gates(b * s * hv);
  for (size_t i = 0; i < gate.size(); ++i) {
    gates[i] = 1.f / (1.f + std::exp(-gate[i]));  // beta = sigmoid(x)
    gate[i] = -std::log1p(std::exp(gate[i]));     // g = -softplus(x)
  }
  Tensor q(normal(b * s * hk * dk, 1.f, rng), dtype), k(normal(b * s * hk * dk, 1.f, rng), dtype);
  Tensor v(normal(b * s * hv * dv, 1.f, rng), dtype), beta(gates, dtype);
  Tensor g(gate, DType::kFloat32), init(normal(b * hv * dk * dv, 0.5f, rng), DType::kFloat32);
  const size_t out_count = b * s * hv * dv, states_count = b * (s - states_from) * hv * dk * dv;
  void *out, *states;
  cudaMalloc(&out, out_count * dflash::dtype_size(dtype) + 1);
  cudaMalloc(&states, states_count * sizeof(float) + 1);
  const cudaError_t launched = dflash::gated_delta_rule_launch(
      shape, dtype, q.device, k.device, v.device, static_cast<const float*>(g.device), beta.device,
      static_cast<const float*>(init.device), states_from, out, static_cast<float*>(states), nullptr);
  const cudaError_t done = cudaDeviceSynchronize();
  std::vector<float> out_want(out_count), states_want(states_count);
  dflash::gated_delta_rule_ref(shape, q.host.data(), k.host.data(), v.host.data(), g.host.data(), beta.host.data(),
                               init.host.data(), states_from, out_want.data(), states_want.data());
  char what[128];
  std::snprintf(what, sizeof what, "GatedDeltaRule b=%ld s=%ld Hk=%ld Hv=%ld Dk=%ld Dv=%ld states_from=%ld", long(b),
                long(s), long(hk), long(hv), long(dk), long(dv), long(states_from));
  if (launched != cudaSuccess || done != cudaSuccess) {
    ++g_failures;
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(launched != cudaSuccess ? launched : done));
  } else {
    compare((std::string(what) + " out").c_str(), read_back(out, out_count, dtype), out_want, dtype);
    compare((std::string(what) + " states").c_str(), read_back(states, states_count, DType::kFloat32), states_want,
            DType::kFloat32);
  }
  cudaFree(out);
  cudaFree(states);
}

// Routed experts: weights scaled so every projection is O(1); `tied` logits take three values, so
// many experts tie on probability and both sides must pick the lowest index. Then the call's rows
// again from a call on a few of its tokens, and a second full call: bit for bit the same (a token's
// output depends on neither the other tokens nor the run).
void moe_case(int64_t t, int64_t h, int64_t e, int64_t n, int64_t k, bool normalize, bool tied, DType dtype) {
  std::mt19937 rng(static_cast<unsigned>(t * 1000 + h * 10 + e + n + k));
  const dflash::MoEShape s{t, h, e, n, k};
  std::vector<float> logits = normal(t * e, 2.f, rng);
  if (tied)
    for (float& l : logits) l = std::min(std::round(std::fabs(l)), 2.f);
  Tensor x(normal(t * h, 1.f, rng), dtype), router(logits, dtype);
  Tensor gate_up(normal(e * 2 * n * h, 1.f / std::sqrt(float(h)), rng), dtype);
  Tensor down(normal(e * h * n, 1.f / std::sqrt(float(n)), rng), dtype);
  const size_t out_count = t * h, size = dflash::dtype_size(dtype);
  void *out, *again, *workspace;
  cudaMalloc(&out, out_count * size + 1);
  cudaMalloc(&again, out_count * size + 1);
  cudaMalloc(&workspace, dflash::moe_workspace_size(s) + 1);
  const auto run = [&](const dflash::MoEShape& shape, int64_t first, void* into) {
    return dflash::moe_launch(shape, dtype, normalize, static_cast<char*>(x.device) + first * h * size,
                              static_cast<char*>(router.device) + first * e * size, gate_up.device, down.device,
                              workspace, static_cast<char*>(into) + first * h * size, nullptr);
  };
  const cudaError_t launched = run(s, 0, out);
  cudaError_t done = cudaDeviceSynchronize();
  std::vector<float> want(out_count);
  dflash::moe_ref(s, x.host.data(), router.host.data(), gate_up.host.data(), down.host.data(), normalize, want.data());
  char what[128];
  std::snprintf(what, sizeof what, "MoE T=%ld H=%ld E=%ld I=%ld top_k=%ld normalize=%d%s", long(t), long(h), long(e),
                long(n), long(k), int(normalize), tied ? " tied logits" : "");
  if (launched != cudaSuccess || done != cudaSuccess) {
    ++g_failures;
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(launched != cudaSuccess ? launched : done));
  } else {
    const std::vector<float> got = read_back(out, out_count, dtype);
    compare(what, got, want, dtype);
    // Tokens [first, first + few) alone, written into their rows of `again`; then the whole call again.
    const int64_t first = t > 1 ? 1 : 0, few = std::min<int64_t>(3, t - first);
    cudaMemset(again, 0xff, out_count * size);
    cudaError_t status = run({few, h, e, n, k}, first, again);
    std::vector<float> alone = read_back(again, out_count, dtype);
    if (status == cudaSuccess) status = run(s, 0, again);
    done = cudaDeviceSynchronize();
    const std::vector<float> twice = read_back(again, out_count, dtype);
    const bool same_rows = std::memcmp(&alone[first * h], &got[first * h], few * h * sizeof(float)) == 0;
    const bool same_run = std::memcmp(twice.data(), got.data(), out_count * sizeof(float)) == 0;
    const bool ok = status == cudaSuccess && done == cudaSuccess && same_rows && same_run;
    if (!ok) ++g_failures;
    const char* why = !same_rows  ? "a token's row changed with the other tokens"
                      : !same_run ? "a rerun changed bits"
                      : ok        ? "bit-exact"
                                  : cudaGetErrorString(status != cudaSuccess ? status : done);
    std::printf("%s %-72s %-8s %s\n", ok ? "ok  " : "FAIL", (std::string(what) + " invariance").c_str(), name(dtype),
                why);
  }
  cudaFree(out);
  cudaFree(again);
  cudaFree(workspace);
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (cudaGetDeviceCount: %s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    inject_kv_case(1, 1, 16, 1, 8, dtype);
    inject_kv_case(2, 5, 32, 2, 16, dtype);
    inject_kv_case(3, 7, 24, 3, 4, dtype);       // hidden and columns not multiples of the 32 tile
    inject_kv_case(1, 16, 4096, 8, 128, dtype);  // Qwen3-8B drafter block: split-K
    inject_kv_case(2, 700, 256, 2, 64, dtype);   // 1400 rows: two launches of the row loop
    inject_kv_case(1, 3, 96, 1, 256, dtype);     // widest head
    inject_kv_case(8, 16, 4096, 8, 128, dtype);  // 128 rows: the GEMV-shaped kernel's 8 row blocks
    inject_kv_case(3, 5, 36, 2, 8, dtype);       // hidden 36: 16-byte loads fit float32 only
    inject_kv_case(9, 15, 64, 1, 16, dtype);     // 135 rows: just past the GEMV-shaped kernel
    inject_kv_case(5, 8, 4096, 8, 128, dtype);   // 40 rows: a part-filled 64-row tensor-core tile
    inject_kv_case(3, 30, 520, 3, 64, dtype);    // 90 rows in one 128-row tile; K past its last 32-wide slice
    inject_kv_case(2, 9, 200, 1, 12, dtype);     // 18 rows; 24 columns: a warp's tile past the last column
    block_attention_case(1, 2, 1, 4, 6, 8, {6}, false, 0, dtype);
    block_attention_case(2, 4, 2, 8, 9, 16, {9, 3}, false, 0, dtype);        // ragged context
    block_attention_case(2, 3, 3, 5, 7, 4, {7, 0}, true, 0, dtype);          // causal; an empty context
    block_attention_case(2, 4, 1, 6, 10, 8, {10, 6}, false, 4, dtype);       // window, both sides
    block_attention_case(1, 2, 2, 16, 20, 8, {17}, true, 5, dtype);          // causal + window
    block_attention_case(1, 2, 1, 4, 0, 8, {0}, false, 0, dtype);            // no context tensor at all
    block_attention_case(1, 32, 8, 16, 4096, 128, {4000}, false, 0, dtype);  // split over keys
    block_attention_case(4, 32, 8, 16, 1024, 128, {1024, 17, 0, 600}, false, 0, dtype);
    block_attention_case(2, 16, 4, 16, 2048, 128, {2048, 1500}, true, 256, dtype);  // sliding window, split
    block_attention_case(1, 8, 2, 16, 300, 80, {300}, false, 0, dtype);             // head_dim not a multiple of 32
    block_attention_case(2, 4, 2, 16, 700, 256, {700, 33}, false, 0, dtype);        // widest head
    block_attention_case(1, 4, 4, 3, 10, 8, {4}, true, 2, dtype);                   // causal window of 2
    // head_dim 128 in 16-bit dtypes runs on tensor cores, 64 rows a block:
    block_attention_case(1, 6, 2, 48, 100, 128, {77}, true, 0, dtype);    // 3 blocks of rows, causal
    block_attention_case(1, 2, 1, 100, 50, 128, {50}, true, 30, dtype);   // a block's slots wrap past n
    block_attention_case(3, 8, 8, 1, 200, 128, {200, 1, 64}, false, 0, dtype);  // one row per kv head
    // at most 16 rows a GQA group: one 16-row tile whose 4 warps split each tile's keys, merged at the end
    block_attention_case(2, 8, 2, 4, 300, 128, {300, 77}, true, 0, dtype);       // 16 rows, causal
    block_attention_case(2, 4, 1, 2, 1000, 128, {999, 5}, false, 37, dtype);     // window both sides, split
    block_attention_case(1, 4, 4, 3, 500, 128, {450}, true, 100, dtype);         // causal window, one row a head
    block_attention_case(2, 32, 8, 1, 130, 128, {0, 129}, true, 0, dtype);       // an empty context: block keys only
    // a target's decode and verify attention (runtime/torch_graphs.py): a server's 4,096-token slot, rows
    // holding far less; the plain step (one query a row) and a verify of 16, causal
    block_attention_case(2, 32, 8, 1, 4096, 128, {1024, 3000}, true, 0, dtype);
    block_attention_case(1, 32, 8, 16, 4096, 128, {1024}, true, 0, dtype);
    gated_delta_rule_case(1, 1, 1, 1, 8, 4, 0, dtype);           // one token
    gated_delta_rule_case(3, 17, 2, 4, 16, 8, 16, dtype);         // a prefill: the last state only
    gated_delta_rule_case(2, 4, 2, 2, 32, 33, 0, dtype);          // Dv past one 32-column tile
    gated_delta_rule_case(1, 5, 2, 4, 100, 20, 3, dtype);         // Dk not a multiple of 4
    gated_delta_rule_case(1, 16, 16, 32, 128, 128, 0, dtype);     // Qwen3-Next verify of a 16-token block
    gated_delta_rule_case(2, 40, 1, 2, 256, 64, 5, dtype);        // widest key head
    // a prefill of a chunk or more (the last state kept, Dk <= 128) takes the chunked form:
    gated_delta_rule_case(2, 77, 2, 4, 64, 40, 76, dtype);        // a short last chunk; Dv past a 32-column block
    gated_delta_rule_case(1, 96, 16, 32, 128, 128, 95, dtype);    // Qwen3-Next heads, three whole chunks
    gated_delta_rule_case(1, 300, 1, 2, 100, 20, 299, dtype);     // Dk not a multiple of 4, ten chunks
    gated_delta_rule_case(1, 32, 1, 1, 8, 4, 31, dtype);          // one chunk exactly
    gated_delta_rule_case(1, 600, 1, 1, 200, 16, 599, dtype);     // Dk past the chunked form's 128: the token loop
    moe_case(1, 64, 8, 32, 2, true, false, dtype);                // decode
    moe_case(4, 128, 16, 64, 4, false, false, dtype);
    moe_case(16, 256, 64, 128, 8, true, false, dtype);            // a verify block: experts shared, some unused
    moe_case(200, 96, 32, 48, 4, true, false, dtype);             // every expert many times: passes of 4 pairs
    moe_case(2, 64, 128, 32, 2, false, false, dtype);             // 4 picks of 128 experts
    moe_case(5, 64, 4, 32, 4, true, false, dtype);                // top_k == E
    moe_case(3, 32, 6, 16, 6, false, false, dtype);               // top_k == E, the weights as the softmax gave
    moe_case(7, 37, 12, 13, 3, false, false, dtype);              // H, I not multiples of 8: one load an element
    moe_case(40, 40, 4, 24, 2, true, false, dtype);               // H 40: tiles past H; ~20 pairs an expert
    moe_case(9, 64, 16, 32, 4, true, true, dtype);                // ties go to the lowest index
    moe_case(4, 32, 512, 16, 16, true, false, dtype);             // most experts, top 16
    moe_case(3, 32, 40, 16, 32, true, false, dtype);              // top 32
    moe_case(700, 64, 16, 32, 4, true, false, dtype);             // two launches of 512 tokens at most
    moe_case(16, 2048, 16, 512, 8, true, false, dtype);           // Qwen3.5-35B-A3B's width, 16 of its experts
  }
  std::printf("%s\n", g_failures ? "FAILED" : "all kernel parity cases passed");
  return g_failures ? 1 : 0;
}
