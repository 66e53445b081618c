// Times the dflash CUDA kernels at the Qwen3-8B drafter's shapes (32 heads, 8 kv heads, head_dim
// 128, hidden 4096, block 16, bfloat16), GatedDeltaRule at Qwen3-Next's linear attention (16 key
// heads, 32 value heads, 128 x 128 state) and MoE at Qwen3.5-35B-A3B's routed experts (hidden 2048,
// 256 experts 512 wide, top-8) against their memory-bandwidth floor: the bytes each call must move
// at least (plugins/*/README.md), over a peak bandwidth, and their arithmetic (FLOPs), which bounds
// the prefill shapes instead. Prints a table; --json PATH also writes it.
// Each row also counts the kernels a call launches, and an empty kernel is timed the same way (launch_us):
// a call cannot take less than its launches times that, however few its bytes.
// Usage: kernel_bench [--json PATH] [--peak-tbps 3.35] [--once]. Exit 77 without a GPU.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "block_attention/block_attention_kernel.h"
#include "gated_delta_rule/gated_delta_rule_kernel.h"
#include "inject_kv/inject_kv_kernel.h"
#include "moe/moe_kernel.h"

namespace {

constexpr int64_t kHeads = 32, kKv = 8, kD = 128, kHidden = 4096, kBlock = 16, kElem = 2;  // bfloat16

struct Row {
  std::string op, shape;
  double bytes, micros, flops;
  int64_t launches;  // kernels per call, as the launch functions plan them
};

// Device buffer of `bytes` filled with small bfloat16-ish values (0x3c00 = 0.0078 as bf16), never zeros.
void* buffer(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes + 16) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
    std::exit(1);
  }
  std::vector<uint16_t> host((bytes + 1) / 2, 0x3c00);
  cudaMemcpy(p, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  return p;
}

// --once: every shape's call runs once, untimed, for a profiler (Nsight Compute) to see one launch of
// each kernel at each shape.
bool g_once = false;

// Mean microseconds per call over 50 calls after 5 warm-up calls, timed with CUDA events (0 with --once).
double time_calls(const std::function<cudaError_t()>& call) {
  if (g_once) {
    const cudaError_t status = call() == cudaSuccess ? cudaDeviceSynchronize() : cudaGetLastError();
    if (status != cudaSuccess) {
      std::fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(status));
      std::exit(1);
    }
    return 0.0;
  }
  for (int i = 0; i < 5; ++i) call();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < 50; ++i) call();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    std::fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(status));
    std::exit(1);
  }
  return ms * 1000.0 / 50;
}

Row inject_kv(int64_t batch, int64_t tokens) {
  const dflash::InjectKVShape s{batch, tokens, kHidden, kKv, kD};
  const int64_t rows = batch * tokens;
  void* x = buffer(rows * kHidden * kElem);
  void* wk = buffer(kKv * kD * kHidden * kElem);
  void* wv = buffer(kKv * kD * kHidden * kElem);
  void* norm = buffer(kD * kElem);
  void* cs = buffer(rows * kD * kElem);
  void* sn = buffer(rows * kD * kElem);
  void* k = buffer(rows * kKv * kD * kElem);
  void* v = buffer(rows * kKv * kD * kElem);
  void* ws = buffer(dflash::inject_kv_workspace_size(s));
  const double micros = time_calls([&] {
    return dflash::inject_kv_launch(s, dflash::DType::kBFloat16, x, wk, wv, norm, cs, sn, 1e-6f, ws, k, v, nullptr);
  });
  for (void* p : {x, wk, wv, norm, cs, sn, k, v, ws}) cudaFree(p);
  // Weights, hidden, cos/sin, k_norm in; k and v out.
  const double bytes =
      kElem * double(2 * kKv * kD * kHidden + rows * kHidden + 2 * rows * kD + kD + 2 * rows * kKv * kD);
  const double flops = 2.0 * rows * kHidden * 2 * kKv * kD;
  const int64_t launches = 2 * ((rows + dflash::InjectKVPlan::kRowsPerLaunch - 1) / dflash::InjectKVPlan::kRowsPerLaunch);
  return {"InjectKV", "b=" + std::to_string(batch) + " n=" + std::to_string(tokens), bytes, micros, flops, launches};
}

// `block` queries a row: the drafter's block of 16, or a target's decode step (1: the kernel's
// key-split form, causal as the target's attention is).
Row block_attention(int64_t batch, int64_t context, int64_t block = kBlock) {
  const dflash::BlockAttentionShape s{batch, kHeads, kKv, block, context, kD};
  void* q = buffer(batch * kHeads * block * kD * kElem);
  void* kc = buffer(batch * kKv * context * kD * kElem);
  void* vc = buffer(batch * kKv * context * kD * kElem);
  void* kb = buffer(batch * kKv * block * kD * kElem);
  void* vb = buffer(batch * kKv * block * kD * kElem);
  void* out = buffer(batch * kHeads * block * kD * kElem);
  void* ws = buffer(dflash::block_attention_workspace_size(s));
  std::vector<int64_t> full(batch, context);  // every row uses its whole context
  int64_t* lengths = static_cast<int64_t*>(buffer(batch * sizeof(int64_t)));
  cudaMemcpy(lengths, full.data(), batch * sizeof(int64_t), cudaMemcpyHostToDevice);
  const double micros = time_calls([&] {
    return dflash::block_attention_launch(s, dflash::DType::kBFloat16, q, kc, vc, kb, vb, lengths, 0.0883883f,
                                          block == 1, 0, ws, out, nullptr);
  });
  for (void* p : {q, kc, vc, kb, vb, out, ws, static_cast<void*>(lengths)}) cudaFree(p);
  // q in, out out, the block's K/V, the valid context's K/V, the lengths.
  const double bytes =
      kElem * double(2 * batch * kHeads * block * kD + 2 * batch * kKv * (block + context) * kD) + 8.0 * batch;
  const double flops = 2.0 * 2 * batch * kHeads * block * (context + block) * kD;  // q k^T and p v
  const int64_t launches = dflash::block_attention_plan(s, true).splits > 1 ? 2 : 1;  // the combine pass
  const std::string rows = block == kBlock ? "" : " n=" + std::to_string(block);
  return {"BlockAttention", "b=" + std::to_string(batch) + rows + " context=" + std::to_string(context), bytes, micros,
          flops, launches};
}

Row gated_delta_rule(int64_t batch, int64_t tokens, int64_t states_from) {
  constexpr int64_t kKeyHeads = 16, kValueHeads = 32, kStateDim = 128;  // Qwen3-Next: Dk = Dv = 128
  const dflash::GatedDeltaRuleShape s{batch, tokens, kKeyHeads, kValueHeads, kStateDim, kStateDim};
  const int64_t heads = batch * tokens * kValueHeads, state = kStateDim * kStateDim;
  const int64_t kept = tokens - states_from;
  void* q = buffer(batch * tokens * kKeyHeads * kStateDim * kElem);
  void* k = buffer(batch * tokens * kKeyHeads * kStateDim * kElem);
  void* v = buffer(heads * kStateDim * kElem);
  void* g = buffer(heads * 4);
  void* beta = buffer(heads * kElem);
  void* init = buffer(batch * kValueHeads * state * 4);
  void* out = buffer(heads * kStateDim * kElem);
  void* states = buffer(batch * kept * kValueHeads * state * 4);
  const double micros = time_calls([&] {
    return dflash::gated_delta_rule_launch(s, dflash::DType::kBFloat16, q, k, v, static_cast<const float*>(g), beta,
                                           static_cast<const float*>(init), states_from, out,
                                           static_cast<float*>(states), nullptr);
  });
  for (void* p : {q, k, v, g, beta, init, out, states}) cudaFree(p);
  // q, k, v, beta in and out out (bfloat16), g (float32), the initial and the kept states (float32).
  const double bytes = kElem * double(2 * batch * tokens * kKeyHeads * kStateDim + 2 * heads * kStateDim + heads) +
                       4.0 * double(heads + batch * kValueHeads * state + batch * kept * kValueHeads * state);
  return {"GatedDeltaRule",
          "b=" + std::to_string(batch) + " s=" + std::to_string(tokens) + " from=" + std::to_string(states_from), bytes,
          micros, 8.0 * heads * state, 1};  // per head and token: decay, k^T S, the rank-1 update, q S
}

// Random routing (normal logits), or every token routed as the first (`shared`). The floor is the
// README's: 3 I H bfloat16 weights of each distinct expert the tokens picked, counted here with the
// reference's routing rule.
Row moe(int64_t tokens, bool shared) {
  constexpr int64_t kExperts = 256, kInter = 512, kHiddenMoE = 2048, kTopK = 8;  // Qwen3.5-35B-A3B
  const dflash::MoEShape s{tokens, kHiddenMoE, kExperts, kInter, kTopK};
  std::mt19937 rng(static_cast<unsigned>(tokens));
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> logits(tokens * kExperts);
  std::vector<float> rounded(kExperts);
  std::set<int64_t> picked;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < kExperts; ++e) {
      uint32_t bits;
      const float value = shared && t > 0 ? rounded[e] : dist(rng);
      std::memcpy(&bits, &value, 4);
      logits[t * kExperts + e] = static_cast<uint16_t>(bits >> 16);  // bfloat16, truncated
      bits = uint32_t{logits[t * kExperts + e]} << 16;
      std::memcpy(&rounded[e], &bits, 4);
    }
    int64_t ids[kTopK];
    float weights[kTopK];
    dflash::moe_route_token(rounded.data(), kExperts, kTopK, true, ids, weights);
    picked.insert(ids, ids + kTopK);
  }
  void* x = buffer(tokens * kHiddenMoE * kElem);
  void* router = buffer(logits.size() * kElem);
  cudaMemcpy(router, logits.data(), logits.size() * kElem, cudaMemcpyHostToDevice);
  void* gate_up = buffer(kExperts * 2 * kInter * kHiddenMoE * kElem);
  void* down = buffer(kExperts * kHiddenMoE * kInter * kElem);
  void* out = buffer(tokens * kHiddenMoE * kElem);
  void* ws = buffer(dflash::moe_workspace_size(s));
  const double micros = time_calls([&] {
    return dflash::moe_launch(s, dflash::DType::kBFloat16, true, x, router, gate_up, down, ws, out, nullptr);
  });
  for (void* p : {x, router, gate_up, down, out, ws}) cudaFree(p);
  const double bytes = kElem * 3.0 * kInter * kHiddenMoE * double(picked.size());
  const double flops = 2.0 * 3 * kInter * kHiddenMoE * tokens * kTopK;
  const std::string shape = "T=" + std::to_string(tokens) + " experts=" + std::to_string(picked.size());
  const int64_t launches = 4 * ((tokens + dflash::kMoETokensPerLaunch - 1) / dflash::kMoETokensPerLaunch);
  return {"MoE", shape + (shared ? " shared" : ""), bytes, micros, flops, launches};
}

}  // namespace

cudaError_t launch_empty_kernel(cudaStream_t stream);  // launch_floor.cu

int main(int argc, char** argv) {
  const char* json = nullptr;
  double peak_tbps = 3.35;  // H100 SXM HBM3
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--once") == 0) g_once = true;
    if (i + 1 < argc && std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
    if (i + 1 < argc && std::strcmp(argv[i], "--peak-tbps") == 0) peak_tbps = std::atof(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::vector<Row> rows;
  for (int64_t batch : {1, 8}) rows.push_back(inject_kv(batch, kBlock));
  rows.push_back(inject_kv(1, 4096));
  for (int64_t batch : {1, 8})
    for (int64_t context : {1024, 4096, 16384}) rows.push_back(block_attention(batch, context));
  for (int64_t batch : {1, 32})  // a target's decode step: one query a row
    for (int64_t context : {1024, 4096}) rows.push_back(block_attention(batch, context, 1));
  for (int64_t batch : {1, 8}) rows.push_back(gated_delta_rule(batch, kBlock, 0));  // verify: every state kept
  rows.push_back(gated_delta_rule(1, 4096, 4095));  // prefill: the last state (the chunked form)
  rows.push_back(gated_delta_rule(8, 512, 511));    // 8 rows' prefill chunks of 512
  rows.push_back(moe(1, false));   // decode
  rows.push_back(moe(16, false));  // verify: random routing, ~102 distinct experts
  rows.push_back(moe(16, true));   // verify: every token on the same 8

  if (g_once) {  // launch order, for reading a profile: the rows above, each 1-2 kernels
    for (const Row& r : rows) std::printf("%s %s\n", r.op.c_str(), r.shape.c_str());
    return 0;
  }
  const double launch_us = time_calls([] { return launch_empty_kernel(nullptr); });
  std::printf("%s, bfloat16, floor at %.2f TB/s, an empty kernel %.2f us\n%-15s %-24s %10s %10s %10s %8s %9s\n",
              prop.name, peak_tbps, launch_us, "op", "shape", "MB", "floor us", "time us", "floor %", "launches");
  for (const Row& r : rows) {
    const double floor_us = r.bytes / (peak_tbps * 1e12) * 1e6;
    std::printf("%-15s %-24s %10.2f %10.2f %10.2f %7.0f%% %9lld\n", r.op.c_str(), r.shape.c_str(), r.bytes / 1e6,
                floor_us, r.micros, 100.0 * floor_us / r.micros, static_cast<long long>(r.launches));
  }
  if (json != nullptr) {
    FILE* f = std::fopen(json, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"dtype\": \"bfloat16\", \"peak_tbps\": %.3f, \"launch_us\": %.3f, \"rows\": [\n",
                 prop.name, peak_tbps, launch_us);
    for (size_t i = 0; i < rows.size(); ++i)
      std::fprintf(f,
                   "  {\"op\": \"%s\", \"shape\": \"%s\", \"bytes\": %.0f, \"flops\": %.0f, \"time_us\": %.3f, "
                   "\"launches\": %lld}%s\n",
                   rows[i].op.c_str(), rows[i].shape.c_str(), rows[i].bytes, rows[i].flops, rows[i].micros,
                   static_cast<long long>(rows[i].launches), i + 1 < rows.size() ? "," : "");
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
