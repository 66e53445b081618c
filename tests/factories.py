"""Tiny random-weight models, tokenizers and drafters written to disk in HF format, for tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

from dflash_trt.models.checkpoints import save_drafter
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.drafter import DFlashDrafter

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
# Qwen3's thinking switch included: enable_thinking=false (a chat_template_kwargs variable) opens the
# reply with an empty think block
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
# CHAT_TEMPLATE's output, plus Qwen3's (hermes) tool format where a request offers tools or a turn
# holds calls or answers one: what `serve --chat-template` takes to let a tiny pair take tool calls
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools>\nCall one as <tool_call>\n{\"name\": <name>, \"arguments\": <object>}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for call in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens + 4 specials (ids 256..259), with a chat template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for name in SPECIALS:
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def linear_attention(layers: int) -> dict:
    """Tiny Gated DeltaNet settings for the hybrid families, alternating with full attention."""
    return {
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "layer_types": ["linear_attention", "full_attention"] * (layers // 2),
    }


def target_config(family: str, vocab_size: int = 264, layers: int = 4, **extra):
    common = dict(vocab_size=vocab_size, num_hidden_layers=layers, max_position_embeddings=512, **SMALL)
    common.update(extra)
    if family == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**common)
    # the MoE families: 4 experts, top 2 unless `extra` says otherwise; the hybrid ones with a gated shared expert
    moe = {name: common.pop(name, value) for name, value in (("num_experts", 4), ("num_experts_per_tok", 2),
                                                             ("moe_intermediate_size", 32))}
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**common, **moe)
    moe["shared_expert_intermediate_size"] = common.pop("shared_expert_intermediate_size", 32)
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(**common, **linear_attention(layers), **moe)
    if family == "qwen3_5_text":
        from transformers.models.qwen3_5 import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**common, **linear_attention(layers))
    if family == "qwen3_5_moe_text":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(**common, **linear_attention(layers), **moe)
    raise ValueError(family)


def make_target(path: Path, family: str = "qwen3", seed: int = 0, tokenizer: bool = True, **config) -> Path:
    """Write a random tiny target checkpoint (config.json + model.safetensors [+ tokenizer])."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(family, **config), dtype=torch.float32)
    return _save_decisive(model, path, tokenizer)


POISON = 200  # make_poisoned_target's default: its target gives NaN logits from this token on


def make_poisoned_target(path: Path, token: int = POISON, seed: int = 0) -> Path:
    """A tiny qwen3 target whose embedding row of `token` is NaN: every logit from that token on is NaN,
    as a float16 overflow or corrupt weights give. Its lm_head row of `token` is 0, so that the target
    itself seldom picks it (a request meets it in its prompt, or by a logit_bias)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config("qwen3"), dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[token] = float("nan")
        model.lm_head.weight[token] = 0.0
    return _save_decisive(model, path, tokenizer=True)


def _save_decisive(model, path: Path, tokenizer: bool) -> Path:
    """Save a random model with its matrices scaled up, so that greedy choices are decisive as in
    real models (default init gives near-uniform logits), with no EOS (+ the byte tokenizer)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    if tokenizer:
        byte_tokenizer().save_pretrained(path)
    return path


def draft_config_dict(
    hidden_size: int = 64,
    layers: int = 2,
    block_size: int = 4,
    target_layer_ids: list[int] | None = (1, 2),
    mask_token_id: int = 259,
    nested: bool = True,
    **extra,
) -> dict:
    raw = dict(
        SMALL,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=512,
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
    )
    fields = dict(block_size=block_size, mask_token_id=mask_token_id)
    if target_layer_ids is not None:
        fields["target_layer_ids"] = list(target_layer_ids)
    if nested:
        raw["dflash_config"] = fields
    else:
        raw.update(fields)
    raw.update(extra)
    return raw


def make_drafter(path: Path, seed: int = 0, draft_vocab: list[int] | None = None, **config) -> Path:
    """Write a random drafter in z-lab HF format (float32, so parity tests see no rounding), with
    a draft vocabulary (draft_vocab.json) when `draft_vocab` lists token ids."""
    raw = draft_config_dict(**config)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(DraftConfig.from_dict(raw))
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norms too, so no weight is a trivial constant
    if draft_vocab is not None:
        drafter.draft_vocab = torch.tensor(sorted(draft_vocab))
    save_drafter(drafter, path, dtype=torch.float32, vocab_source="test")
    # keep the author's own field layout (top-level vs nested) exactly as given
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path


DFLASH2_TINY = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)


def make_dflash2_drafter(path: Path, seed: int = 0, vocab_size: int = 264, **config) -> Path:
    """A random DFlash2 drafter (in-block convolutions, candidate selector; models/dflash2.py) in the
    published layout, every weight drawn. Its parity with the authors' module is
    tests/models/test_dflash2.py's; this one feeds executor tests."""
    raw = draft_config_dict(**config)
    raw["dflash_config"].update(DFLASH2_TINY)
    raw["architectures"], raw["vocab_size"] = ["DFlash2DraftModel"], vocab_size
    torch.manual_seed(seed)
    drafter = DFlashDrafter(DraftConfig.from_dict(raw))
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_drafter(drafter, path, dtype=torch.float32, vocab_source="test")
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path


class OracleDraftSession:
    """Test double for the drafter: proposes the target's own greedy continuation, corrupting
    each slot with probability `corrupt`, so a test can drive full, partial and zero acceptance
    through the real loop. It rebuilds the committed sequence from what the loop tells it."""

    def __init__(self, model, prompt: list[int], corrupt: float, seed: int = 0):
        self.model = model
        self.history: list[int] = []
        self.prompt = list(prompt)
        self.last_block: list[int] = []
        self.corrupt = corrupt
        self.rng = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def draft(self, features, bonus: int, block_size: int) -> list[int]:
        n = features.shape[0]
        self.history += self.prompt if not self.history else self.last_block[:n]
        seq = self.history + [bonus]
        drafts = []
        for _ in range(block_size - 1):
            logits = self.model(torch.tensor([seq + drafts])).logits[0, -1]
            token = int(logits.argmax())
            if float(torch.rand((), generator=self.rng)) < self.corrupt:
                token = int(torch.randint(logits.shape[0], (), generator=self.rng))
            drafts.append(token)
        self.last_block = [bonus, *drafts]
        return drafts


class OracleDraftBlock(torch.nn.Module):
    """Test double for the draft block graph (DraftBlockGraph's I/O): proposes the continuation of a
    known token sequence after each row's bonus token (at position context_lengths[i]), corrupting
    each slot with probability `corrupt`, so the core's torch executor sees full, partial and zero
    acceptance. For one request at a time whose committed tokens are a prefix of `sequence`."""

    def __init__(self, sequence: list[int], vocab: int, corrupt: float, seed: int = 0):
        super().__init__()
        self.sequence, self.vocab, self.corrupt = list(sequence), vocab, corrupt
        self.rng = torch.Generator().manual_seed(seed)

    def forward(self, block_ids, context_lengths, *context):
        m, block = block_ids.shape
        tokens = torch.zeros(m, block - 1, dtype=torch.long)
        for i in range(m):
            start = int(context_lengths[i]) + 1
            for j, token in enumerate(self.sequence[start:start + block - 1]):
                corrupt = float(torch.rand((), generator=self.rng)) < self.corrupt
                tokens[i, j] = int(torch.randint(self.vocab, (), generator=self.rng)) if corrupt else token
        return tokens


# Targets of each kind the slot executors run, as make_target / export_tiny_slots_bundle arguments.
SLOT_KINDS = {
    "dense": dict(family="qwen3"),
    "sliding-window": dict(family="qwen3", use_sliding_window=True, sliding_window=3, max_window_layers=2),
    "hybrid": dict(family="qwen3_5_text"),
    "moe": dict(family="qwen3_moe"),
    "hybrid-moe": dict(family="qwen3_5_moe_text"),
}


def tiny_slots_pair(root: Path, kind: str, export: bool = True) -> tuple[Path | None, str, str]:
    """A tiny random pair of SLOT_KINDS[kind] under `root` -> (its slots bundle, or None when not
    `export`; target dir; drafter dir)."""
    config = dict(SLOT_KINDS[kind])
    family = config["family"]
    if export:
        bundle = export_tiny_slots_bundle(root, **config)
    else:
        bundle = None
        config.pop("family")
        make_target(root / family, family, **config)
        make_drafter(root / f"{family}-draft", block_size=4, target_layer_ids=[1, 2])
    return bundle, str(root / family), str(root / f"{family}-draft")


def export_tiny_slots_bundle(path: Path, family: str = "qwen3", dtype: str = "float32", seed: int = 0,
                             check: bool = False, quant: str | None = None, **target_config) -> Path:
    """A tiny random (target, drafter) pair under `path`, exported as a `slots` bundle (graph
    contract 2) to path / "bundle"; returns that directory. `target_config` goes to the target's
    config (e.g. use_sliding_window=True, sliding_window=3, max_window_layers=2 for qwen3)."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    path = Path(path)
    target_dir = make_target(path / family, family, seed=seed, **target_config)
    draft_dir = make_drafter(path / f"{family}-draft", seed=seed, block_size=4, target_layer_ids=[1, 2])
    target, tokenizer = load_target(str(target_dir))
    return export_bundle(target, load_drafter(draft_dir), tokenizer, path / "bundle", flavour="slots", check=check,
                         dtype=dtype, quant=quant)


# Qwen3.5 as published: a vision-language checkpoint (Qwen3_5[Moe]ForConditionalGeneration weights,
# text under `model.language_model.`, vision under `model.visual.`) around a text model.
VL_TEXT_FAMILIES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, num_position_embeddings=16)


def vl_config(family: str = "qwen3_5", tie_word_embeddings: bool = False, **text):
    """A tiny Qwen3.5 VL config: `text` goes to the text model's (see target_config); the vision
    tower's output feeds the text model, so its out_hidden_size is the text hidden size."""
    text_config = target_config(VL_TEXT_FAMILIES[family], **text)
    if family == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5Config as config_class
    else:
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig as config_class
    vision = dict(TINY_VISION, out_hidden_size=text_config.hidden_size)
    # a tie set on the VL model only, as the text model's own flag may not repeat it
    return config_class(text_config=text_config.to_dict(), vision_config=vision,
                        tie_word_embeddings=tie_word_embeddings)


def make_vl_target(path: Path, family: str = "qwen3_5", seed: int = 0, tokenizer: bool = True,
                   tie_word_embeddings: bool = False, **text) -> Path:
    """Write a random tiny Qwen3.5 VL checkpoint (config.json + model.safetensors [+ tokenizer])."""
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    config = vl_config(family, tie_word_embeddings, **text)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    return _save_decisive(model, path, tokenizer)
