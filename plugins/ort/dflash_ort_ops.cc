// ONNX Runtime custom-op library for the `dflash` domain (CPU): dflash::InjectKV, dflash::BlockAttention,
// dflash::GatedDeltaRule and dflash::MoE, thin wrappers over the CPU kernels in plugins/<op>/ (the
// reference kernels, but GatedDeltaRule's vectorised one-pass kernel, gated_delta_rule_cpu.h, and MoE's
// expert-grouped one, moe_cpu.h).
// Load it with SessionOptions.register_custom_ops_library(path); it exports RegisterCustomOps.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#include <onnxruntime_lite_custom_op.h>
#undef ORT_API_MANUAL_INIT

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "block_attention/block_attention_ref.h"
#include "gated_delta_rule/gated_delta_rule_cpu.h"
#include "inject_kv/inject_kv_ref.h"
#include "moe/moe_cpu.h"

namespace {

using Ort::Custom::Tensor;

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

struct InjectKV {
  InjectKV(const OrtApi*, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info{info};
    num_kv_heads_ = kernel_info.GetAttribute<int64_t>("num_kv_heads");
    epsilon_ = kernel_info.GetAttribute<float>("epsilon");
  }

  void Compute(const Tensor<float>& hidden, const Tensor<float>& k_weight, const Tensor<float>& v_weight,
               const Tensor<float>& k_norm, const Tensor<float>& cos, const Tensor<float>& sin, Tensor<float>& k_out,
               Tensor<float>& v_out) {
    const auto& h = hidden.Shape();
    const auto& c = cos.Shape();
    require(h.size() == 3 && c.size() == 3, "dflash::InjectKV: hidden and cos must be rank 3");
    dflash::InjectKVShape s{h[0], h[1], h[2], num_kv_heads_, c[2]};
    require(k_weight.Shape() == std::vector<int64_t>{s.kv_heads * s.head_dim, s.hidden} &&
                v_weight.Shape() == k_weight.Shape(),
            "dflash::InjectKV: k_weight and v_weight must be [num_kv_heads * head_dim, hidden]");
    require(k_norm.NumberOfElement() == s.head_dim && sin.Shape() == c && c[0] == s.batch && c[1] == s.tokens,
            "dflash::InjectKV: k_norm must be [head_dim] and cos/sin [batch, tokens, head_dim]");
    require(s.head_dim % 2 == 0, "dflash::InjectKV: head_dim must be even (rotate-half RoPE)");
    const std::vector<int64_t> out_shape{s.batch, s.kv_heads, s.tokens, s.head_dim};
    dflash::inject_kv_ref(s, hidden.Data(), k_weight.Data(), v_weight.Data(), k_norm.Data(), cos.Data(), sin.Data(),
                          epsilon_, k_out.Allocate(out_shape), v_out.Allocate(out_shape));
  }

  int64_t num_kv_heads_ = 0;
  float epsilon_ = 0.f;
};

struct BlockAttention {
  BlockAttention(const OrtApi*, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info{info};
    scale_ = kernel_info.GetAttribute<float>("scale");
    causal_ = kernel_info.GetAttribute<int64_t>("causal") != 0;
    window_ = kernel_info.GetAttribute<int64_t>("window");
  }

  void Compute(const Tensor<float>& q, const Tensor<float>& k_context, const Tensor<float>& v_context,
               const Tensor<float>& k_block, const Tensor<float>& v_block, const Tensor<int64_t>& context_lengths,
               Tensor<float>& out) {
    const auto& qs = q.Shape();
    const auto& kc = k_context.Shape();
    const auto& kb = k_block.Shape();
    require(qs.size() == 4 && kc.size() == 4 && kb.size() == 4, "dflash::BlockAttention: q, k, v must be rank 4");
    dflash::BlockAttentionShape s{qs[0], qs[1], kc[1], qs[2], kc[2], qs[3]};
    require(v_context.Shape() == kc && v_block.Shape() == kb, "dflash::BlockAttention: K and V shapes differ");
    require(kb == std::vector<int64_t>{s.batch, s.kv_heads, s.block, s.head_dim} && kc[0] == s.batch &&
                kc[3] == s.head_dim,
            "dflash::BlockAttention: k_block must be [batch, kv_heads, block, head_dim] matching q");
    require(s.kv_heads > 0 && s.heads % s.kv_heads == 0, "dflash::BlockAttention: heads must be a multiple of kv_heads");
    require(context_lengths.NumberOfElement() == s.batch, "dflash::BlockAttention: context_lengths must be [batch]");
    dflash::block_attention_ref(s, q.Data(), k_context.Data(), v_context.Data(), k_block.Data(), v_block.Data(),
                                context_lengths.Data(), scale_, causal_, window_, out.Allocate(qs));
  }

  float scale_ = 1.f;
  bool causal_ = false;
  int64_t window_ = 0;
};

struct GatedDeltaRule {
  GatedDeltaRule(const OrtApi*, const OrtKernelInfo*) {}  // no attributes: every size comes from the shapes

  void Compute(const Tensor<float>& query, const Tensor<float>& key, const Tensor<float>& value, const Tensor<float>& g,
               const Tensor<float>& beta, const Tensor<float>& initial_state, const Tensor<int64_t>& states_from,
               Tensor<float>& out, Tensor<float>& states) {
    const auto& qs = query.Shape();
    const auto& vs = value.Shape();
    require(qs.size() == 4 && vs.size() == 4, "dflash::GatedDeltaRule: query, key and value must be rank 4");
    dflash::GatedDeltaRuleShape s{qs[0], qs[1], qs[2], vs[2], qs[3], vs[3]};
    require(key.Shape() == qs,
            "dflash::GatedDeltaRule: key must have query's shape [batch, tokens, key_heads, key_dim]");
    require(vs[0] == s.batch && vs[1] == s.tokens,
            "dflash::GatedDeltaRule: value must be [batch, tokens, value_heads, value_dim] matching query");
    const std::vector<int64_t> gate_shape{s.batch, s.tokens, s.value_heads};
    require(g.Shape() == gate_shape && beta.Shape() == gate_shape,
            "dflash::GatedDeltaRule: g and beta must be [batch, tokens, value_heads]");
    require(initial_state.Shape() == std::vector<int64_t>{s.batch, s.value_heads, s.key_dim, s.value_dim},
            "dflash::GatedDeltaRule: initial_state must be [batch, value_heads, key_dim, value_dim]");
    require(s.key_heads > 0 && s.value_heads % s.key_heads == 0,
            "dflash::GatedDeltaRule: value_heads must be a multiple of key_heads");
    require(states_from.NumberOfElement() == 1,
            "dflash::GatedDeltaRule: states_from must be one int64 (shape [])");
    const int64_t first = states_from.Data()[0];
    require(s.tokens >= 1 && first >= 0 && first < s.tokens,
            "dflash::GatedDeltaRule: states_from must be in [0, tokens - 1] = [0, " + std::to_string(s.tokens - 1) +
                "], got " + std::to_string(first));
    dflash::gated_delta_rule_cpu(
        s, query.Data(), key.Data(), value.Data(), g.Data(), beta.Data(), initial_state.Data(), first,
        out.Allocate(vs), states.Allocate({s.batch, s.tokens - first, s.value_heads, s.key_dim, s.value_dim}));
  }
};

struct MoE {
  MoE(const OrtApi*, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info{info};
    top_k_ = kernel_info.GetAttribute<int64_t>("top_k");
    normalize_ = kernel_info.GetAttribute<int64_t>("normalize") != 0;
  }

  void Compute(const Tensor<float>& hidden, const Tensor<float>& router_logits, const Tensor<float>& gate_up,
               const Tensor<float>& down, Tensor<float>& out) {
    const auto& h = hidden.Shape();
    const auto& w = gate_up.Shape();
    require(h.size() == 2 && w.size() == 3, "dflash::MoE: hidden must be [tokens, H] and gate_up [E, 2I, H]");
    dflash::MoEShape s{h[0], h[1], w[0], w[1] / 2, top_k_};
    require(w[1] % 2 == 0 && w[2] == s.hidden, "dflash::MoE: gate_up must be [E, 2I, H] with H hidden's width");
    require(router_logits.Shape() == std::vector<int64_t>{s.tokens, s.experts},
            "dflash::MoE: router_logits must be [tokens, E]");
    require(down.Shape() == std::vector<int64_t>{s.experts, s.hidden, s.inter}, "dflash::MoE: down must be [E, H, I]");
    require(s.top_k >= 1 && s.top_k <= s.experts, "dflash::MoE: top_k must be in [1, E] = [1, " +
                                                       std::to_string(s.experts) + "], got " + std::to_string(s.top_k));
    dflash::moe_cpu(s, hidden.Data(), router_logits.Data(), gate_up.Data(), down.Data(), normalize_, out.Allocate(h));
  }

  int64_t top_k_ = 0;
  bool normalize_ = true;
};

}  // namespace

// The op contract version (plugins/*/README.md headings, dflash_trt.export.plugin_ops.OP_VERSION):
// bundles record the version their graphs were exported for, and the runtime compares it with this.
extern "C" int DflashOpsVersion() { return 1; }

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  // One domain object for the process: sessions keep pointers to it.
  static Ort::CustomOpDomain domain{"dflash"};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> inject_kv{
      Ort::Custom::CreateLiteCustomOp<InjectKV>("InjectKV", "CPUExecutionProvider")};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> block_attention{
      Ort::Custom::CreateLiteCustomOp<BlockAttention>("BlockAttention", "CPUExecutionProvider")};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> gated_delta_rule{
      Ort::Custom::CreateLiteCustomOp<GatedDeltaRule>("GatedDeltaRule", "CPUExecutionProvider")};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> moe{
      Ort::Custom::CreateLiteCustomOp<MoE>("MoE", "CPUExecutionProvider")};
  static std::once_flag added;
  try {
    std::call_once(added, [] {
      domain.Add(inject_kv.get());
      domain.Add(block_attention.get());
      domain.Add(gated_delta_rule.get());
      domain.Add(moe.get());
    });
    Ort::UnownedSessionOptions(options).Add(domain);
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
