"""DFlash2 drafters: tiny random ones built with the authors' `DFlash2DraftModel` and saved in the
published layout (bare selector codebooks), loaded by us and held to the authors' module (block
pass, selector path) and loop (tokens and acceptance per step); refusals; v1 untouched."""

import json
import time

import pytest
import torch
from click.testing import CliRunner
from factories import draft_config_dict, make_target
from safetensors.torch import save_file
from transformers import Qwen3Config

from dflash_trt import LLM, SamplingParams
from dflash_trt.cli import main
from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.models.dflash2 import GroupedDynamicConv
from dflash_trt.models.draft_config import DraftConfig

reference = pytest.importorskip("dflash.model", reason="test oracle: pip install --no-deps dflash==0.1.0")

DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
VOCAB = 264  # the tiny targets' (factories.target_config)


def dflash2_config(**extra) -> dict:
    raw = draft_config_dict(block_size=4, **extra)
    raw["dflash_config"].update(DFLASH2)
    raw["architectures"] = ["DFlash2DraftModel"]
    raw["vocab_size"] = VOCAB
    return raw


def authors_drafter(raw: dict, seed: int = 0):
    """The authors' DFlash2DraftModel with every weight drawn (its conv base kernels start empty)."""
    torch.manual_seed(seed)
    model = reference.DFlash2DraftModel(Qwen3Config(**raw, num_target_layers=4)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model


def save_published(model, raw: dict, path):
    """The published layout: safetensors with the selector's codebooks as bare tensors."""
    path.mkdir(parents=True)
    state = {name.removesuffix(".weight") if "codebook" in name else name: t.contiguous()
             for name, t in model.state_dict().items() if "rotary" not in name}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(raw))
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2")
    raw = dflash2_config()
    model = authors_drafter(raw)
    return make_target(root / "target", "qwen3"), save_published(model, raw, root / "draft"), model


def test_the_config_names_the_method_and_a_v1_drafter_never_takes_the_v2_path():
    v2 = DraftConfig.from_dict(dflash2_config())
    assert v2.method == "dflash2" and "DFlash2 (conv 2 taps per 16 channels, selector top-4 rank 8)" == v2.describe()
    top_level = draft_config_dict(nested=False) | DFLASH2 | {"vocab_size": VOCAB}
    assert DraftConfig.from_dict(top_level).method == "dflash2"
    v1 = DraftConfig.from_dict(draft_config_dict())
    assert v1.method == "dflash" and v1.conv_kernel_size is None
    from dflash_trt.models.drafter import DFlashDrafter

    drafter = DFlashDrafter(v1)
    assert not any("conv" in n or "selector" in n for n in drafter.state_dict())
    assert drafter.head(torch.nn.Linear(64, VOCAB)).selector is None


@pytest.mark.parametrize("drop", list(DFLASH2))
def test_a_partial_dflash2_config_is_refused_naming_the_missing_field(drop):
    raw = dflash2_config()
    del raw["dflash_config"][drop]
    with pytest.raises(DFlashError, match=f"needs {drop} beside"):
        DraftConfig.from_dict(raw)


def test_a_config_that_claims_one_method_over_the_others_weights_is_refused(pair, tmp_path):
    _, draft_dir, model = pair
    v1_config = {k: v for k, v in json.loads((draft_dir / "config.json").read_text()).items() if k != "architectures"}
    v1_config["dflash_config"] = {k: v for k, v in v1_config["dflash_config"].items() if k not in DFLASH2}
    claims_v1 = tmp_path / "claims-v1"
    claims_v1.mkdir()
    (claims_v1 / "model.safetensors").write_bytes((draft_dir / "model.safetensors").read_bytes())
    (claims_v1 / "config.json").write_text(json.dumps(v1_config))
    with pytest.raises(DFlashError, match="weights are a DFlash2 drafter's .* but config.json has no conv_kernel_size"):
        load_drafter(claims_v1)
    v1 = reference.DFlashDraftModel(Qwen3Config(**v1_config, num_target_layers=4))
    claims_v2 = save_published(v1, dflash2_config(), tmp_path / "claims-v2")
    with pytest.raises(DFlashError, match="describes a DFlash2 drafter .* but the weights have no convolutions"):
        load_drafter(claims_v2)


def test_the_block_pass_and_the_selector_path_equal_the_authors_module(pair):
    _, draft_dir, model = pair
    ours = load_drafter(draft_dir)
    assert ours.config.method == "dflash2"
    config = ours.config
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(config.hidden_size, VOCAB, bias=False)
    torch.nn.init.normal_(head.weight, generator=gen)
    for context_length, batch in ((9, 1), (3, 2)):
        feats = torch.randn(batch, context_length, len(config.target_layer_ids) * config.hidden_size, generator=gen)
        noise = torch.randn(batch, config.block_size, config.hidden_size, generator=gen)
        anchor = torch.randint(0, VOCAB, (batch,), generator=gen)
        positions = torch.arange(context_length + config.block_size)[None].expand(batch, -1)
        with torch.no_grad():
            expected = model(target_hidden=feats, noise_embedding=noise, position_ids=positions,
                             past_key_values=reference._make_cache(model.config), use_cache=True)
            path, _, _ = model.propose(expected[:, 1:], anchor, head, 0.0)
            context = ours.inject_context(feats, positions[:, :context_length])
            got = ours.block_hidden(noise, positions[:, context_length:], context, positions[:, :context_length])
            _, tokens = ours.head(head)(got[:, 1:], anchor)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert tokens.tolist() == path.tolist()


def test_the_selector_tables_give_the_authors_sampling_distribution_at_every_step(pair):
    """draft_rule="drafter": the executor draws position t's candidate from softmax(scores[t, i] / T),
    i its pick at t-1. Along the authors' own sampled walk, that distribution over token ids equals the
    one their `select` drew from at each position."""
    _, draft_dir, model = pair
    ours = load_drafter(draft_dir)
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 3, ours.config.hidden_size, generator=gen)
    logits = torch.randn(2, 3, VOCAB, generator=gen) * 2
    anchor = torch.randint(0, VOCAB, (2,), generator=gen)
    temperature = 0.8
    with torch.no_grad():
        torch.manual_seed(5)
        path, candidates, q_rows = model.candidate_selector.select(hidden, logits, anchor, temperature)
        n, columns, ids, scores = ours.candidate_selector.tables(hidden, logits, anchor)
    assert torch.equal(columns, ids)  # no draft vocabulary: the columns are the target ids
    for b in range(2):
        before = 0  # position 0 scores after the anchor (every row alike)
        for t in range(n):
            theirs = torch.zeros(VOCAB).index_add_(0, candidates[b, t], q_rows[b, t])
            mine = torch.zeros(VOCAB).index_add_(0, ids[b, t], torch.softmax(scores[b, t, before] / temperature, -1))
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
            before = int((ids[b, t] == path[b, t]).nonzero())
        assert torch.equal(ours.candidate_selector.walk(n, columns, ids, scores)[b],
                           model.candidate_selector.select(hidden, logits, anchor, 0.0)[0][b])


@pytest.mark.parametrize("block", [2, 4])
def test_the_drafter_rule_runs_dflash2_alike_on_both_backends(pair, bundles, block):
    """Drafts walked through the selector's distribution: a seeded request's tokens are the same on
    onnxruntime and torch, alone and in a batch, at a block below the drafter's too (the graph's tables
    cover the block's drafts only), and the rule is in effect (other tokens than point mass)."""
    target_dir, draft_dir, _ = pair
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.9, seed=4)
    ours = LLM.from_bundle(bundles["slots"], block_size=block, max_batch=2, capacity=64, draft_rule="drafter")
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=block, backend="torch", draft_rule="drafter")
    prompts = [[17, 3, 250, 99], [5, 6, 7], [8, 1]]
    got = [o.token_ids for o in ours.generate(prompts, params)]
    assert got == [o.token_ids for o in torch_llm.generate(prompts, params)]
    assert got == [ours.generate(p, params)[0].token_ids for p in prompts]
    point_mass = LLM.from_bundle(bundles["slots"], block_size=block, max_batch=2, capacity=64)
    assert got != [o.token_ids for o in point_mass.generate(prompts, params)]
    with pytest.raises(DFlashError, match="needs the draft block graph's selector_scores"):
        LLM.from_bundle(bundles["slots-trt"], block_size=4, capacity=64, draft_rule="drafter")


def test_the_exported_and_the_eager_convolution_kernels_are_equal_bit_for_bit():
    """The export traces the group spread as a one-hot product, PyTorch runs it as a broadcast
    (models/dflash2.py): the same kernels, float for float."""
    conv = GroupedDynamicConv(48, 2, 16).requires_grad_(False)
    torch.nn.init.normal_(conv.base_kernel)
    torch.nn.init.normal_(conv.kernel_projection.weight)
    x = torch.randn(2, 5, 48)
    traced = torch.jit.trace(lambda h: torch.stack(conv.kernels(h)), x)
    assert "aten::matmul" in str(traced.graph)  # the trace took the product, the eager run the broadcast
    for h in (x, x * 3):
        assert torch.equal(traced(h), torch.stack(conv.kernels(h)))


def test_the_convolution_never_reads_across_the_block_boundary(pair):
    """Causal within the block: changing the positions after t leaves outputs 0..t of both
    convolutions unchanged (t = 0: the anchor reads only itself, zero padding before it). And the
    drafter hands them the block alone, so neither the context nor a previous block is ever read."""
    conv = GroupedDynamicConv(32, 3, 8)
    torch.nn.init.normal_(conv.base_kernel)
    torch.nn.init.normal_(conv.kernel_projection.weight)
    block = torch.randn(2, 6, 32)
    for t in range(6):
        changed = block.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])  # everything after position t
        with torch.no_grad():
            a, b = (conv.around(lambda h: h * 2.0, x) for x in (block, changed))
        torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
        if t < 5:
            assert not torch.allclose(a[:, t + 1], b[:, t + 1])
    # the drafter hands each layer's convolutions the block alone ([b, B, H]), never the context
    _, draft_dir, _ = pair
    drafter = load_drafter(draft_dir)
    seen = []
    original = GroupedDynamicConv.around
    GroupedDynamicConv.around = lambda self, sublayer, x: seen.append(x.shape[1]) or original(self, sublayer, x)
    try:
        context = drafter.inject_context(torch.randn(1, 7, 128), torch.arange(7)[None])
        with torch.no_grad():
            drafter.block_hidden(torch.randn(1, 4, 64), torch.arange(7, 11)[None], context, torch.arange(7)[None])
    finally:
        GroupedDynamicConv.around = original
    assert seen == [4] * 4  # 2 layers x (attention, MLP), each over the 4 block positions


def test_greedy_equals_hf_and_the_authors_loop_step_for_step(pair, monkeypatch):
    monkeypatch.setattr(reference, "_cuda_time", time.perf_counter)  # its stats timer syncs CUDA
    target_dir, draft_dir, model = pair
    llm = LLM(str(target_dir), str(draft_dir), block_size=4, backend="torch")
    target, _ = load_target(str(target_dir))
    prompt = [17, 3, 250, 99, 4, 4, 61]
    with torch.no_grad():
        hf = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    ours = llm.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert ours.token_ids == hf[0, len(prompt):].tolist()
    stats = reference.dflash_generate(model, target.model, torch.tensor([prompt]), max_new_tokens=24,
                                      stop_token_ids=None, block_size=4, return_stats=True)
    n = len(stats.acceptance_lengths) - 1  # its last step is cut at max_new_tokens
    assert ours.metrics.acceptance_lengths[:n] == stats.acceptance_lengths[:n]


@pytest.fixture(scope="module")
def bundles(pair, tmp_path_factory):
    """flavour -> the DFlash2 pair exported with the polygraphy check (graph vs PyTorch)."""
    from dflash_trt.export.bundle import export_bundle

    target_dir, draft_dir, _ = pair
    root = tmp_path_factory.mktemp("dflash2-bundles")
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    return {flavour: export_bundle(target, drafter, tokenizer, root / flavour, flavour=flavour, check=True,
                                   capacity=64 if flavour == "slots-trt" else None)
            for flavour in ("slots", "portable", "slots-trt", "plugin")}


def test_every_flavour_exports_the_block_pass_and_the_selector_walk(bundles):
    from dflash_trt.export.manifest import read_bundle

    for flavour, bundle in bundles.items():
        manifest = read_bundle(bundle)
        assert manifest["draft"]["method"] == "dflash2", flavour
        assert manifest["checks"]["polygraphy_vs_pytorch"]["draft_block"] == "passed", flavour
        outputs = [o["name"] for o in manifest["graphs"]["draft_block"]["outputs"]]
        # the onnxruntime flavour also returns the selector's tables (draft_rule="drafter"), checked too
        assert outputs == ["draft_tokens"] + (["selector_scores", "selector_columns"] if flavour == "slots" else [])
    shown = CliRunner().invoke(main, ["inspect", str(bundles["slots"])]).stdout
    assert "draft: dflash2, " in shown and "draft rules point-mass, drafter" in shown  # inspect names the method


@pytest.mark.parametrize("block", [2, 3, 4])
def test_the_slots_bundle_decodes_greedy_as_ar_with_the_torch_backends_drafts(pair, bundles, block):
    """Every block size up to the drafter's: the graph walks the selector over the block's drafts
    (unrolled for the drafter's block, the first B-1 kept), so acceptance equals the torch backend's."""
    target_dir, draft_dir, _ = pair
    ours = LLM.from_bundle(bundles["slots"], block_size=block, max_batch=2, capacity=64)
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=block, backend="torch")
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for prompt in ([17, 3, 250, 99, 4, 4, 61], [5, 6, 7]):
        got = ours.generate(prompt, params)[0]
        want = torch_llm.generate(prompt, params)[0]
        assert got.token_ids == torch_llm.generate(prompt, params, speculative=False)[0].token_ids
        assert got.metrics.acceptance_lengths == want.metrics.acceptance_lengths


def test_a_seeded_sampled_request_gives_the_same_tokens_on_both_backends(pair, bundles):
    """T>0: the drafts are the selector's greedy path and the executor's sample-then-compare rule
    decides, with the request's own random stream, wherever it runs."""
    target_dir, draft_dir, _ = pair
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)
    ours = LLM.from_bundle(bundles["slots"], block_size=4, max_batch=2, capacity=64)
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=4, backend="torch")
    prompts = [[17, 3, 250, 99], [5, 6, 7]]
    got = [o.token_ids for o in ours.generate(prompts, params)]
    assert got == [o.token_ids for o in torch_llm.generate(prompts, params)]
    assert got[1] == ours.generate(prompts[1], params)[0].token_ids  # alone = in a batch


def test_a_block_beyond_the_drafters_is_refused_at_load(bundles):
    with pytest.raises(DFlashError, match="larger than this DFlash2 drafter's block"):
        LLM.from_bundle(bundles["slots"], block_size=5, max_batch=1, capacity=64)


def test_tensorrt_rtx_builds_the_dflash2_draft_block(bundles, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="needs the tensorrt-rtx wheel")
    from dflash_trt.engines.build import build_engines
    from dflash_trt.engines.config import BuildConfig

    build_engines(bundles["portable"], tmp_path / "e", BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",),
                                                                   max_seq_len=128))
    assert (tmp_path / "e" / "draft_block.engine").stat().st_size > 10_000


def test_the_dry_run_names_the_method_counts_its_weights_and_says_export_waits(pair):
    from dflash_trt.engines.plan import drafter_parameters

    target_dir, draft_dir, model = pair
    drafter = load_drafter(draft_dir)
    assert drafter_parameters(drafter.config) == sum(p.numel() for p in model.parameters())  # the authors' module
    result = CliRunner().invoke(main, ["build", "--dry-run", "--target", str(target_dir), "--draft", str(draft_dir)])
    assert result.exit_code == 0, result.output
    assert "(DFlash2 (conv 2 taps per 16 channels, selector top-4 rank 8))" in result.stdout
    assert "export: supported" in result.stdout
