"""The `dflash-trt` command line: thin Click wrappers over the Python API."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import sys
from functools import wraps
from pathlib import Path

import click

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import DRAFT_QUANTS, DTYPES, QUANTS, read_bundle
from dflash_trt.models.embedded import DEFAULT_TARGET

TARGET_HELP = f"HF checkpoint directory, hub id, or alias (default: {DEFAULT_TARGET}, embedded)."
DRAFT_HELP = "DFlash drafter directory (z-lab HF format). Default: the drafter shipped for the target."
QUANT_HELP = ("int4: the target's matmul weights in 4 bits, blocks of 32, round to nearest (fp32 exports): "
              "onnxruntime's MatMulNBits for --flavour slots, int4 DequantizeLinear (TensorRT's weight-only INT4) "
              "for slots-trt. fp8 (E4M3, a scale per output channel; GPUs from SM 8.9) and nvfp4 (E2M1 in blocks of "
              "16; SM 12.0): TensorRT's weight-only formats, --flavour slots-trt only, scales by NVIDIA ModelOpt. "
              "int4-awq: int4 after ModelOpt's AWQ-lite rescales the weights on text the target samples itself "
              "(llama, qwen3). "
              "Greedy output equals the quantized target's own greedy output.")
DRAFT_QUANT_HELP = ("int4 / fp8 / nvfp4: the drafter's matmul weights as --quant writes the target's (int4: slots, "
                    "slots-trt; fp8, nvfp4: slots-trt; fp32 exports). "
                    "Drafts are verified, so output is unchanged; drafting costs less, acceptance may drop.")
DRAFT_RULE_HELP = ("At T>0: point-mass drafts the drafter's argmax (a seeded reply equals the plain sampled one); "
                   "drafter draws drafts from the drafter's distribution, kept with min(1, p/q) (needs --block-size "
                   "and graphs that return that distribution: a slots bundle, engines of a slots-trt export with "
                   "--draft-distribution, or the torch backend).")
GENERATION_CONFIG_HELP = ("vLLM's: where the sampling defaults of a request that leaves fields out come from: auto, the "
                          "model's generation_config.json (its temperature, top_p, top_k, min_p, repetition_penalty "
                          "and max_new_tokens, which caps max_tokens); vllm, none; or a directory holding one.")
OVERRIDE_GENERATION_HELP = ("vLLM's: a JSON object of those fields set over what --generation-config found, e.g. "
                            "'{\"temperature\": 0.6}'.")
DRAFT_DISTRIBUTION_HELP = ("The draft block graph also returns what --draft-rule drafter draws from (the drafter's "
                           "float32 logits, or a DFlash2 drafter's selector tables) [default: yes for --flavour "
                           "slots; for slots-trt only when asked, since a TensorRT engine writes every output at "
                           "every draft step, the rule running or not].")


def _json_strings(ctx, param, value):
    """A JSON list of strings (vLLM's form of its CORS options) -> a tuple; one line for anything else."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(item, str) and item for item in parsed):
        raise click.BadParameter(f"a JSON list of strings, e.g. '[\"https://app.example\"]'; got {value!r}")
    return tuple(parsed)


def user_errors(command):
    """A DFlashError becomes one 'Error: ...' line and exit status 2, never a traceback; so does an
    OSError about a named file (a path the user gave that cannot be read or written, a full disk),
    wherever it surfaces."""

    @wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except DFlashError as err:
            raise UserError(str(err)) from None
        except OSError as err:
            if err.filename is None or err.strerror is None:
                raise
            raise UserError(f"{err.filename}: {err.strerror}") from None

    return run


class UserError(click.ClickException):
    """Printed as one 'Error: ...' line (no usage text: the command line itself was fine)."""

    exit_code = 2


class RecordingGroup(click.Group):
    """Keeps the arguments it was invoked with (`ctx.meta["argv"]`), so records can say how they were
    made: sys.argv is the host's command line when the CLI runs inside another program (tests, scripts)."""

    def parse_args(self, ctx, args):
        ctx.meta["argv"] = list(args)
        return super().parse_args(ctx, args)


AUTO_BACKEND_HELP = ("auto: torch on CUDA where PyTorch sees a GPU; on the CPU onnxruntime (a slots bundle exported "
                     "once into the user cache, on the C++ executor: the fastest CPU path) when there is a drafter, "
                     "else torch.")


def invoked_command() -> str:
    return shlex.join(["dflash-trt", *click.get_current_context().meta["argv"]])


@click.group(cls=RecordingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dflash-trt")
def main():
    """dflash-trt: lossless DFlash speculative decoding, from HF checkpoints to TensorRT engines."""


@main.command()
@click.argument("prompt")
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help=TARGET_HELP)
@click.option("--draft", default=None, help=DRAFT_HELP)
@click.option("--backend", type=click.Choice(["auto", "torch", "onnxruntime", "tensorrt"]), default="auto",
              show_default=True, help=AUTO_BACKEND_HELP)
@click.option("--bundle", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Run what export or build wrote instead of --target/--draft: an ONNX bundle or onnxruntime "
                   "engines on onnxruntime, TensorRT engines on the GPU.")
@click.option("--block-size", type=int, default=None, help="Verify block size B (default: the drafter's, at most 4: on a CPU a larger verify costs more than its drafts save).")
@click.option("--speculative/--no-speculative", default=True, show_default=True, help="Off: plain autoregressive decoding.")
@click.option("--max-tokens", type=int, default=None, help="[default: 256, or the model's generation config's]")
@click.option("--temperature", type=float, default=None,
              help="0 is greedy [default: the model's generation config's, else 0].")
@click.option("--top-p", type=float, default=None, help="[default: the model's generation config's, else 1]")
@click.option("--top-k", type=int, default=None, help="0 disables top-k [default: the model's generation config's, else 0].")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable); cut from the output.")
@click.option("--presence-penalty", type=float, default=0.0, show_default=True,
              help="Subtracted from the logit of each token the reply has (OpenAI's; in [-2, 2]).")
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
              help="Times a token's count in the reply, subtracted from its logit (OpenAI's; in [-2, 2]).")
@click.option("--repetition-penalty", type=float, default=None,
              help="Divides a positive logit (multiplies a negative one) of each token the prompt or reply has "
                   "(vLLM's; in [1e-6, 2]) [default: the model's generation config's, else 1].")
@click.option("--json-schema", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Structured output: the reply follows this JSON schema file (a grammar masks every decision).")
@click.option("--regex", default=None, help="Structured output: the reply matches this regular expression.")
@click.option("--choice", "choices", multiple=True, help="Structured output: the reply is one of these (repeatable).")
@click.option("--grammar", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Structured output: the reply follows this grammar file (Lark, or GBNF as llama.cpp and vLLM take).")
@click.option("--thinking-token-budget", type=int, default=None,
              help="At most N tokens inside a think block (<think> ... </think>), then </think> is forced.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, metrics) instead of streaming.")
@click.option("--logprobs", type=int, default=None,
              help="With --json: each token's log-probability and the N most probable tokens' (the target's raw "
                   "logits), as [[token id, logprob], ...] per token, the token's own first.")
@click.option("--prompt-logprobs", type=int, default=None,
              help="With --json: each prompt token's log-probability (after the first) and the N most probable "
                   "tokens' there, as --logprobs gives them (null for the first token).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="--backend torch: where its models run (default: cuda when PyTorch sees a GPU, else cpu).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None,
              help="--backend torch: its models' dtype (default: bfloat16 on a GPU, float32 on the CPU).")
@click.option("--quant", type=click.Choice(QUANTS), default=None,
              help="--backend onnxruntime (auto picks it) or tensorrt: " + QUANT_HELP)
@click.option("--draft-quant", type=click.Choice(DRAFT_QUANTS), default=None, help=DRAFT_QUANT_HELP)
@click.option("--draft-rule", type=click.Choice(["point-mass", "drafter"]), default="point-mass", show_default=True,
              help=DRAFT_RULE_HELP)
@click.option("--generation-config", default="auto", show_default=True, help=GENERATION_CONFIG_HELP)
@click.option("--override-generation-config", default=None, help=OVERRIDE_GENERATION_HELP)
@user_errors
def generate(prompt, target, draft, backend, bundle, block_size, speculative, max_tokens, temperature, top_p, top_k, seed, stop,
             presence_penalty, frequency_penalty, repetition_penalty, json_schema, regex, choices, grammar,
             thinking_token_budget, as_json, logprobs, prompt_logprobs, device, dtype, quant, draft_quant, draft_rule,
             generation_config, override_generation_config):
    """Generate a reply to PROMPT, streaming it, then print the acceptance summary."""
    from dflash_trt.runtime.llm import AUTO, BUNDLE_PLACED, LLM
    from dflash_trt.spec.metrics import summary_line
    from dflash_trt.spec.sampling import SamplingParams

    for name, asked in (("--logprobs", logprobs), ("--prompt-logprobs", prompt_logprobs)):
        if asked is not None and not as_json:
            raise DFlashError(f"{name} goes with --json (the streamed text has nowhere to put them)")
    structured = {"json": json_schema and json_schema.read_text(), "regex": regex, "choice": list(choices) or None,
                  "grammar": grammar and grammar.read_text()}
    structured = {kind: value for kind, value in structured.items() if value is not None}
    # the options given; those left out take the model's sampling defaults once it is loaded
    given = {name: value for name, value in (("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                                             ("top_k", top_k), ("repetition_penalty", repetition_penalty))
             if value is not None}
    params = SamplingParams(  # checked before any work
        **given, seed=seed, stop=stop, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        structured_output=structured or None, thinking_token_budget=thinking_token_budget,
    )
    generation = {"generation_config": generation_config, "override_generation_config": override_generation_config}
    if bundle:
        if device or dtype or quant or draft_quant:
            raise DFlashError(BUNDLE_PLACED)
        llm = LLM.from_bundle(bundle, block_size=block_size, draft_rule=draft_rule, **generation)
    else:
        llm = LLM(target=target, draft=draft or AUTO, backend=backend, block_size=block_size, device=device,
                  dtype=dtype, quant=quant, draft_quant=draft_quant, draft_rule=draft_rule, **generation)
    params = dataclasses.replace(params, **{k: v for k, v in llm.sampling_defaults.items() if k not in given})
    if speculative and not llm.has_drafter:
        raise DFlashError(f"no drafter for target '{target}': pass --draft DIR or --no-speculative")
    if as_json:
        out = llm.generate(prompt, params, speculative=speculative)[0]
        def listed(found):  # [[token id, logprob], ...] per token (None stays None)
            return [None if entries is None else [list(e) for e in entries.items()] for entries in found]

        extra = {name: listed(found) for name, found in (("logprobs", out.logprobs),
                                                         ("prompt_logprobs", out.prompt_logprobs)) if found is not None}
        click.echo(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                               "metrics": out.metrics.to_dict(), **extra}))
    else:
        shown = 0
        for out in llm.stream(prompt, params, speculative=speculative):
            click.echo(out.text[shown:], nl=False)
            shown = len(out.text)
        click.echo()
        click.echo(f"[{out.finish_reason}] {summary_line(out.metrics)}", err=True)
    if out.finish_reason == "error":  # what came before it is out; the exit status says it failed
        raise DFlashError(out.error)


@main.command()
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help=TARGET_HELP)
@click.option("--draft", default=None, help=DRAFT_HELP)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path, file_okay=False), required=True, help="Bundle directory to write.")
@click.option("--flavour", type=click.Choice(["portable", "plugin", "slots", "slots-trt"]), default="slots",
              show_default=True,
              help="slots: the target writes fixed-capacity KV caches in place (graph contract 2, "
                   "com.microsoft GroupQueryAttention), what generate/serve --bundle run on the C++ onnxruntime "
                   "executor; slots-trt: the same contract in standard ops (opset 24) for TensorRT engines, with "
                   "--capacity; portable (standard ONNX ops) and plugin (dflash:: custom ops): graph contract 1, "
                   "for engine builds only (TensorRT-RTX), not run by the runtime.")
@click.option("--capacity", type=int, default=None,
              help="slots-trt only (and required there): the KV slots' size in tokens, static in the graphs.")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="fp32", show_default=True,
              help="Precision of the graphs' weights, K/V caches and features (logits stay fp32).")
@click.option("--quant", type=click.Choice(QUANTS), default=None, help=QUANT_HELP)
@click.option("--draft-quant", type=click.Choice(DRAFT_QUANTS), default=None, help=DRAFT_QUANT_HELP)
@click.option("--draft-distribution/--no-draft-distribution", default=None, help=DRAFT_DISTRIBUTION_HELP)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Compare each graph on onnxruntime with PyTorch (polygraphy run --onnxrt); "
                   "graphs onnxruntime cannot run (bf16; plugin with fp16) are skipped and recorded.")
@user_errors
def export(target, draft, out, flavour, capacity, dtype, quant, draft_quant, draft_distribution, force, check):
    """Export target and drafter to an ONNX bundle (target, draft_context, draft_block graphs + bundle.json)."""
    from tqdm import tqdm

    if out.exists() and not force:
        raise DFlashError(f"{out} already exists; pass --force to replace it")
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.export.staging import check_output_dir

    check_output_dir(out)

    pair = _load_pair(target, draft, flavour, DTYPES[dtype], check, capacity, quant, draft_quant,
                      draft_distribution=draft_distribution)
    with tqdm(total=5, desc="export", unit="step") as bar:
        path = export_bundle(*pair, out, flavour=flavour, dtype=DTYPES[dtype], force=force, check=check,
                             progress=_progress(bar), capacity=capacity, quant=quant, draft_quant=draft_quant,
                             draft_distribution=draft_distribution)
    for graph, verdict in (read_bundle(path, verify_hashes=False)["checks"]["polygraphy_vs_pytorch"] or {}).items():
        if str(verdict).startswith("skipped"):  # recorded in bundle.json; said here so it is not missed
            click.echo(f"{graph}.onnx: onnxruntime check {verdict}", err=True)
    click.echo(f"bundle written to {path}")


def _load_pair(target: str, draft: str | None, flavour: str, dtype: str, check: bool = True,
               capacity: int | None = None, quant: str | None = None, draft_quant: str | None = None,
               engine: str | None = None, draft_distribution: bool | None = None):
    """Check the pair from its configs, then load it -> (target model, drafter, tokenizer). Everything a
    user can get wrong is refused here, before any progress bar starts (export, build: `engine`)."""
    import torch

    from dflash_trt.export.bundle import check_flavour
    from dflash_trt.models.checkpoints import check_pair, load_drafter, load_target, load_tokenizer, resolve_draft
    from dflash_trt.models.embedded import default_drafter
    from dflash_trt.models.pairing import validate_pair

    draft = draft or default_drafter(target)
    if draft is None:
        raise DFlashError(f"no drafter for target '{target}': pass --draft DIR")
    draft = resolve_draft(draft)
    check_flavour(flavour, check, dtype, capacity, draft_distribution)  # before loading weights: a missing op library fails in seconds
    check_pair(target, draft)  # from configs, before any weights load
    from dflash_trt.engines.plan import build_memory_refusal, export_memory_refusal, moe_layers, pair_weight_bytes
    from dflash_trt.export.graphs import export_refusal
    from dflash_trt.models.checkpoints import read_draft_config, read_target_config

    from dflash_trt.export.quantize import draft_quant_refusal, quant_refusal

    target_config, draft_config = read_target_config(target)[1], read_draft_config(draft)
    refusal = (export_refusal(target_config.model_type)
               or quant_refusal(quant, flavour, dtype, moe_layers(target_config) > 0, target_config.model_type)
               or draft_quant_refusal(draft_quant, flavour, dtype)
               or export_memory_refusal(target_config, draft_config, dtype)
               or (build_memory_refusal(pair_weight_bytes(target_config, draft_config, dtype), engine) if engine else None))
    if refusal:
        raise DFlashError(refusal)
    drafter = load_drafter(draft)
    # in the bundle's dtype from the start: a float32 copy of a bfloat16 checkpoint would double the memory
    target_model, tokenizer = load_target(target, dtype=getattr(torch, dtype))
    validate_pair(target_model, drafter.config, tokenizer, load_tokenizer(str(draft)))
    return target_model, drafter, tokenizer


def _progress(bar):
    def step(what: str) -> None:
        bar.set_postfix_str(what)
        bar.update()

    return step


def engine_table(manifest: dict) -> str:
    """One row per engine: graph, file, size, build time."""
    rows = [("graph", "file", "MB", "build s")]
    for graph, info in manifest["engines"].items():
        rows.append((graph, info["file"], f"{info['bytes'] / 1e6:.1f}", f"{info['build_s']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    engine = manifest["engine"]
    head = (f"{engine['kind']} {engine['version']}, {manifest['dtype']}"
            + (f", SM {', '.join(manifest['compute_capabilities'])}" if manifest["compute_capabilities"] else "")
            + f", max batch {manifest['max_batch']}, max seq len {manifest['max_seq_len']}, block {manifest['block_size']}")
    return "\n".join([head, *lines])


def _engine_default(compute_capability: str | None) -> str:
    """--compute-capability names consumer GPUs to build for ahead of time (TensorRT-RTX); with a GPU
    here, full TensorRT builds for it; otherwise the CPU engine."""
    if compute_capability:
        return "tensorrt-rtx"
    from dflash_trt.engines.machine import gpu_compute_capability

    return "tensorrt" if gpu_compute_capability() else "onnxruntime"


@main.command()
@click.option("--target", default=None, help=TARGET_HELP + " Exported first (see export).")
@click.option("--draft", default=None, help=DRAFT_HELP)
@click.option("--bundle", "source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Build from this exported ONNX bundle instead of --target/--draft.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Engine bundle directory to write (required unless --dry-run).")
@click.option("--engine", type=click.Choice(["tensorrt-rtx", "tensorrt", "onnxruntime"]), default=None,
              help="tensorrt-rtx: ahead of time for consumer GPUs (no GPU needed); tensorrt: for this GPU, with the "
                   "dflash plugin library; onnxruntime: optimized CPU graphs. Default: tensorrt-rtx with "
                   "--compute-capability, else tensorrt on a GPU, else onnxruntime.")
@click.option("--compute-capability", default=None, help="Comma-separated targets for tensorrt-rtx, e.g. 12.0,8.9.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="Precision of weights and activations (default: the bundle's; fp32 when exporting).")
@click.option("--flavour", type=click.Choice(["portable", "plugin", "slots", "slots-trt"]), default=None,
              help="When exporting [default: slots for --engine onnxruntime, slots-trt (with --capacity, default "
                   "--max-seq-len) for tensorrt, portable for tensorrt-rtx]: slots writes the target's KV caches "
                   "in place (--engine onnxruntime); slots-trt does so in standard ops with --capacity (TensorRT "
                   "engines for the batched C++ executor); plugin expresses KV injection and block attention as "
                   "dflash:: ops (contract-1 engines, not run by the runtime).")
@click.option("--capacity", type=int, default=None,
              help="When exporting --flavour slots-trt (and required there): the KV slots' size in tokens.")
@click.option("--quant", type=click.Choice(QUANTS), default=None, help="When exporting: " + QUANT_HELP)
@click.option("--draft-quant", type=click.Choice(DRAFT_QUANTS), default=None, help="When exporting: " + DRAFT_QUANT_HELP)
@click.option("--draft-distribution/--no-draft-distribution", default=None,
              help="When exporting: " + DRAFT_DISTRIBUTION_HELP)
@click.option("--max-batch", type=int, default=None,
              help="Largest batch the engines accept [default: 8 for slots / slots-trt graphs (batched), else 1].")
@click.option("--max-seq-len", type=int, default=2048, show_default=True, help="Longest sequence (prompt + output).")
@click.option("--block-size", type=int, default=None, help="Largest verify block (default: the drafter's).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan from the pair's config.json files alone (graphs, parameters, weight bytes per dtype, "
                   "K/V and recurrent-state bytes, fit in --gpu-memory); download, export and write nothing.")
@click.option("--gpu-memory", type=float, default=None, help="With --dry-run: GPU memory in GiB the plan must fit.")
@user_errors
def build(target, draft, source, out, engine, compute_capability, dtype, flavour, capacity, quant, draft_quant,
          draft_distribution, max_batch, max_seq_len, block_size, force, dry_run, gpu_memory):
    """Build engines from a (target, drafter) pair or an ONNX bundle: one engine per graph, with
    optimization profiles for the prefill and the B-token steps, and engine.json."""
    import tempfile

    from tqdm import tqdm

    from dflash_trt.engines.build import build_engines, check_graphs, check_source
    from dflash_trt.engines.config import BuildConfig, parse_compute_capabilities
    from dflash_trt.engines.plan import build_memory_refusal
    from dflash_trt.export.bundle import SLOT_FLAVOURS, export_bundle
    from dflash_trt.export.manifest import read_bundle
    from dflash_trt.export.staging import check_output_dir
    from dflash_trt.runtime.batch_runner import DEFAULT_MAX_BATCH

    if source is not None and (target or draft):
        raise DFlashError("pass either --bundle or --target/--draft, not both")
    if source is not None and capacity is not None:
        raise DFlashError("--capacity is for exporting --target/--draft; a --bundle keeps the capacity it was exported with")
    if source is not None and (quant or draft_quant):
        raise DFlashError("--quant and --draft-quant are for exporting --target/--draft; a --bundle keeps the weights "
                          "it was exported with")
    if source is not None and draft_distribution is not None:
        raise DFlashError("--draft-distribution is for exporting --target/--draft; a --bundle keeps the draft outputs "
                          "it was exported with")
    engine = engine or _engine_default(compute_capability)
    if source is None and flavour is None:  # what the runtime's C++ executors run, where one can
        flavour = {"onnxruntime": "slots", "tensorrt": "slots-trt"}.get(engine, "portable")
        capacity = capacity or (max_seq_len if flavour == "slots-trt" else None)
    if max_batch is None:  # contract-2 graphs run batched (the C++ executors); contract 1 one request per session
        batched = (read_bundle(source, verify_hashes=False)["flavour"] if source is not None else flavour) in SLOT_FLAVOURS
        max_batch = DEFAULT_MAX_BATCH if batched else 1
    config = BuildConfig(engine=engine,
                         compute_capabilities=parse_compute_capabilities(compute_capability),
                         dtype=DTYPES[dtype] if dtype else None, max_batch=max_batch, max_seq_len=max_seq_len,
                         block_size=block_size, force=force)
    if dry_run or gpu_memory is not None:
        return _dry_run(target, draft, source, config, flavour, dry_run, gpu_memory)
    if out is None:
        raise DFlashError("build needs -o/--output DIR for the engine bundle (or --dry-run to only see the plan)")
    if out.exists() and not force:
        raise DFlashError(f"{out} already exists; pass --force to replace it")
    check_output_dir(out)
    if source is not None:  # refusals before any engine is built, or any weights load
        check_source(read_bundle(source), config, str(source))
        refusal = build_memory_refusal(sum(f.stat().st_size for f in source.iterdir() if ".onnx" in f.name), config.engine)
        if refusal:
            raise DFlashError(refusal)
    else:
        check_graphs(flavour, config.dtype or "float32", config, "--target/--draft", (quant, draft_quant))
    pair = None if source is not None else _load_pair(target or DEFAULT_TARGET, draft, flavour, config.dtype or "float32",
                                                       capacity=capacity, quant=quant, draft_quant=draft_quant,
                                                       engine=config.engine, draft_distribution=draft_distribution)
    exported = None
    with tqdm(total=4 + (5 if source is None else 0), desc=f"build ({config.engine})", unit="step") as bar:
        try:
            if source is None:
                exported = Path(tempfile.mkdtemp(prefix=f".{out.name}-onnx-", dir=out.parent))
                source = export_bundle(*pair, exported / "bundle", flavour=flavour, dtype=config.dtype or "float32",
                                       progress=_progress(bar), capacity=capacity, quant=quant,
                                       draft_quant=draft_quant, draft_distribution=draft_distribution)
            manifest = build_engines(source, out, config, command=invoked_command(), progress=_progress(bar))
        finally:
            if exported is not None:
                shutil.rmtree(exported, ignore_errors=True)
    click.echo(engine_table(manifest))
    click.echo(f"engine bundle written to {out}")


def _dry_run(target, draft, source, config, flavour: str, dry_run: bool, gpu_memory: float | None) -> None:
    """`build --dry-run`: the plan from config.json alone; every family is planned, exportable or not."""
    from dflash_trt.engines.plan import plan_pair, render

    if not dry_run:
        raise DFlashError("--gpu-memory checks a plan: add --dry-run")
    if source is not None:
        raise DFlashError("--dry-run plans from the pair's configs: pass --target/--draft instead of --bundle")
    click.echo(render(plan_pair(target or DEFAULT_TARGET, draft, config, flavour, gpu_memory)))


def _capacity_text(manifest: dict) -> str:
    """", KV capacity N (static)" for graphs that fix it (slots-trt), else ""."""
    return f", KV capacity {manifest['capacity']} (static)" if manifest.get("capacity") else ""


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path, file_okay=False))
@click.option("--no-verify", is_flag=True, help="Skip re-hashing the files (fast look at a large bundle).")
@user_errors
def inspect(bundle, no_verify):
    """Describe an exported bundle (graphs and their I/O, pair settings, checks, versions) or an
    engine bundle (engines, profiles, plugin library, the bundle it was built from)."""
    from dflash_trt.engines.manifest import is_engine_bundle
    from dflash_trt.export.manifest import read_bundle

    if is_engine_bundle(bundle):
        _inspect_engines(bundle, no_verify)
        return
    manifest = read_bundle(bundle, verify_hashes=not no_verify)
    t, d = manifest["target"], manifest["draft"]
    click.echo(f"{bundle}: {manifest['flavour']} flavour, {manifest['dtype']}, opset {manifest['opset']}, "
               f"format {manifest['format_version']}, graph contract {manifest.get('contract', 1)}"
               f"{_capacity_text(manifest)}{'' if no_verify else ', all file hashes match'}")
    click.echo(f"target: {t['model_type']}, {t['num_layers']} layers, hidden {t['hidden_size']}, vocab {t['vocab_size']}")
    if "quant" in manifest:
        q = manifest["quant"]
        click.echo(f"  weights {q['weights']}: {q['quantized_matmuls']} matmuls as {q['form']}, scales "
                   f"{q.get('scales') or 'one per block of ' + str(q.get('block_size'))}, by {q['method']}; "
                   f"activations {q['activations']}; {q['float_matmuls']} float matmuls left"
                   + (f"; every step feeds {manifest['min_query_tokens']} query rows at least"
                      if "min_query_tokens" in manifest else ""))
    if "linear_attention" in t:  # a hybrid target: which layers carry states instead of K/V
        linear = [i for i, kind in enumerate(t["layer_types"]) if kind == "linear_attention"]
        la = t["linear_attention"]
        click.echo(f"  Gated DeltaNet layers {linear} (conv {la['conv_dim']} x {la['conv_kernel'] - 1}, recurrent state "
                   f"{la['num_value_heads']} x {la['key_head_dim']} x {la['value_head_dim']} float32); "
                   f"full attention on the other {t['num_layers'] - len(linear)}")
    click.echo(f"draft: {d.get('method', 'dflash')}, {d['num_layers']} layers, block size {d['block_size']}, taps "
               f"{d['target_layer_ids']}, mask id {d['mask_token_id']}, drafts from "
               f"{d.get('draft_vocab_size', t['vocab_size'])} token ids; draft rules {_draft_rules(manifest)}")
    if "draft_quant" in manifest:
        q = manifest["draft_quant"]
        click.echo(f"  weights {q['weights']}: draft_block's {q['quantized_matmuls']} matmuls as {q['form']} (and "
                   f"draft_context's)")
    for graph in manifest["graphs"].values():
        click.echo(f"{graph['file']}:")
        for kind in ("inputs", "outputs"):
            shown = graph[kind] if len(graph[kind]) <= 6 else graph[kind][:4] + [{"name": f"... {len(graph[kind]) - 4} more"}]
            for io in shown:
                shape = "" if "shape" not in io else f" {io['dtype']}[{', '.join(map(str, io['shape']))}]"
                click.echo(f"  {kind[:-1]:6} {io['name']}{shape}")
    checks = manifest.get("checks", {})
    click.echo(f"checks: {json.dumps(checks)}")
    click.echo("versions: " + ", ".join(f"{k} {v}" for k, v in manifest["versions"].items() if v))


def _draft_rules(manifest: dict) -> str:
    """The draft rules its graphs can run (the drafter rule needs the draft block's distribution)."""
    from dflash_trt.runtime.ort_executor import DRAFT_RULES, draft_rule_refusal

    return ", ".join(rule for rule in DRAFT_RULES if draft_rule_refusal(rule, manifest) is None)


def _inspect_engines(bundle: Path, no_verify: bool) -> None:
    from dflash_trt.engines.manifest import read_engine_bundle

    manifest = read_engine_bundle(bundle, verify_hashes=not no_verify)
    click.echo(f"{bundle}: engine bundle, format {manifest['format_version']}{'' if no_verify else ', all file hashes match'}")
    click.echo(engine_table(manifest))
    for graph, phases in manifest["profiles"].items():
        shown = "; ".join(f"{phase} " + ", ".join(f"{dim} {lo}..{hi} (opt {opt})" for dim, (lo, opt, hi) in dims.items())
                          for phase, dims in phases.items())
        click.echo(f"profiles {graph}: {shown}")
    plugin = manifest.get("plugin_library")
    click.echo("plugin library: " + ("none" if plugin is None else f"{plugin['file']} v{plugin['version']} sha256 {plugin['sha256'][:16]}"))
    source, t, d = manifest["source"], manifest["source"]["target"], manifest["source"]["draft"]
    click.echo(f"source bundle: {source['flavour']} flavour, graph contract {source.get('contract', 1)}"
               f"{_capacity_text(source)}, sha256 {source['bundle_sha256'][:16]}; target {t['model_type']} "
               f"{t['num_layers']} layers; draft {d.get('method', 'dflash')}, {d['num_layers']} layers, block size "
               f"{d['block_size']}, taps {d['target_layer_ids']}; draft rules {_draft_rules(source)}")
    if manifest.get("command"):
        click.echo(f"built with: {manifest['command']}")


def _block_size(value: str) -> int:
    """A --block-size item: an integer, or "auto" (0: the bench's adaptive setting)."""
    return 0 if value.strip() == "auto" else int(value)


_block_size.noun = "ints or auto"


def _csv(kind):
    """Click callback: "1,8,32" -> (1, 8, 32), with a one-line error naming the option."""
    def parse(ctx, param, value):
        if value is None:
            return ()
        try:
            return tuple(kind(v.strip()) for v in value.split(",") if v.strip())
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {getattr(kind, 'noun', kind.__name__ + 's')}, got '{value}'") from None
    return parse


@main.command("train-drafter")
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help=TARGET_HELP)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True, help="Run directory.")
@click.option("--corpus", type=click.Path(path_type=Path), default=None, help="Corpus directory (default: OUT/corpus); resumed if present.")
@click.option("--prompts", "num_prompts", type=int, default=1600, show_default=True, help="Training prompts to answer.")
@click.option("--data-minutes", type=float, default=None, help="Stop answering prompts after this long (keep what is done).")
@click.option("--corpus-only", is_flag=True, help="Build (or extend) the corpus and stop; train later with --corpus.")
@click.option("--max-new-tokens", type=int, default=256, show_default=True, help="Longest target response.")
@click.option("--mix", default=None,
              help="Prompt sources and shares, e.g. code=0.35,math=0.15,assistant=0.35,chat=0.15 (the default); "
                   "chat (self-instructed) gets what the others leave.")
@click.option("--layers", type=int, default=2, show_default=True, help="Draft layers.")
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--block-sizes", "block_sizes", default=None, callback=_csv(int),
              help="Verify block sizes to train, one drawn at random per block, e.g. 16,8,4 (default: --block-size "
                   "only); a drafter trained on 16-slot blocks alone drafts worse when decoding verifies 8.")
@click.option("--taps", default=None, help="Target layer ids to tap, e.g. 1,8,14,20,27 (default: 5 evenly spaced).")
@click.option("--mask-token-id", type=int, default=None, help="MASK id (default: the tokenizer's mask token; SmolLM2: 16).")
@click.option("--anchors", type=int, default=24, show_default=True, help="Blocks per sequence per step.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences per training step (raise on a GPU, e.g. 32).")
@click.option("--gen-batch", type=click.IntRange(min=1), default=48, show_default=True, help="Prompts the target answers at once (raise on a GPU, e.g. 256).")
@click.option("--store-features/--online-features", default=None,
              help="Keep the target's tapped features in the corpus (default on CPU) or recompute them each "
                   "training step (default on a GPU, where storing ~6 KB per token costs more).")
@click.option("--bf16", is_flag=True, help="Train with bfloat16 matmuls (GPUs; CPUs with AVX512-BF16 or AMX; refused on other CPUs, where it is ~25x slower).")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--lr", type=float, default=6e-4, show_default=True)
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Position-weight decay: slot k weighs exp(-(k-1)/gamma) (default: 7 for B=16, 4 for B=8).")
@click.option("--distill", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of the loss taken against the target's own next-token distribution (soft labels) "
                   "instead of its greedy token; attention-only targets.")
@click.option("--init-drafter", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Start from this drafter's weights (e.g. fine-tune the shipped one on a larger corpus).")
@click.option("--train-minutes", type=float, default=None, help="Stop training after this long and write the drafter.")
@click.option("--draft-vocab", type=click.IntRange(min=0), default=16384, show_default=True,
              help="The drafter proposes only this many of the training responses' most frequent tokens "
                   "(a smaller output layer: a faster draft; 0: any token).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default=None, help="torch device (default: cuda when present, else cpu).")
@user_errors
def train_drafter(target, out, corpus, num_prompts, data_minutes, corpus_only, max_new_tokens, mix, layers, block_size,
                  block_sizes, taps,
                  mask_token_id, anchors, batch, gen_batch, store_features, bf16, epochs, lr, gamma, distill,
                  init_drafter, train_minutes, draft_vocab, seed, device):
    """Train a DFlash drafter for TARGET: regenerate responses, then fit. Resumable."""
    import torch

    from dflash_trt.models.checkpoints import load_target
    from dflash_trt.models.draft_config import default_target_layer_ids
    from dflash_trt.train.corpus import CorpusConfig, build_corpus, parse_mix
    from dflash_trt.train.teacher import check_distillable
    from dflash_trt.train.trainer import TrainConfig, Trainer, check_bf16, check_init_drafter, draft_config_for

    shares = {} if mix is None else parse_mix(mix)
    TrainConfig(block_size=block_size, block_sizes=block_sizes)  # its checks, before the target loads
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if bf16:
        check_bf16(device)
    target_model, tokenizer = load_target(target)
    target_model.model.to(device)  # the target answers the prompts on the training device too
    tap_ids = (
        tuple(int(t) for t in taps.split(","))
        if taps else tuple(default_target_layer_ids(target_model.num_layers, 5))
    )
    if mask_token_id is None:
        mask_token_id = 16 if target == DEFAULT_TARGET else getattr(tokenizer, "mask_token_id", None)
    if mask_token_id is None:
        raise DFlashError("this tokenizer has no mask token: pass --mask-token-id (an id the target never emits)")
    train = TrainConfig(layers=layers, block_size=block_size, block_sizes=block_sizes,
                        mask_token_id=mask_token_id, anchors=anchors,
                        batch=batch, bf16=bf16, epochs=epochs, lr=lr, gamma=gamma, distill=distill, seed=seed,
                        max_minutes=train_minutes, draft_vocab=draft_vocab,
                        init_drafter=None if init_drafter is None else str(init_drafter))
    if init_drafter is not None:  # checked before the corpus is built: that can take an hour
        check_init_drafter(train.init_drafter, draft_config_for(target_model, tap_ids, train))
    if distill:  # also before the corpus is built
        check_distillable(target_model.model)
    corpus = corpus or out / "corpus"
    if store_features is None:
        store_features = torch.device(device).type == "cpu"
    config = CorpusConfig(taps=tap_ids, num_prompts=num_prompts, max_new_tokens=max_new_tokens, seed=seed,
                          batch_size=gen_batch, store_features=store_features, **shares)
    build_corpus(target_model, tokenizer, corpus, config, deadline_s=None if data_minutes is None else 60 * data_minutes)
    if corpus_only:
        click.echo(f"corpus written to {corpus}")
        return
    trainer = Trainer(target_model, corpus, out, train, device=device)
    summary = trainer.fit()
    path = trainer.export(summary)
    click.echo(f"drafter written to {path}: validation mean acceptance length {summary['val_tau']:.2f} per block, "
               f"{summary['val_tau_decode']:.2f} per decoding step (greedy, B={block_size}, "
               f"{summary['val_sequences']} held-out sequences)")


@main.command("draft-vocab")
@click.argument("draft", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--corpus", "corpora", multiple=True, required=True,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="A training corpus (repeatable): its responses are counted, held-out ones excepted.")
@click.option("--size", type=click.IntRange(min=0), default=16384, show_default=True,
              help="How many of the most frequent response tokens to keep (0: remove the list, any token).")
@user_errors
def draft_vocab(draft, corpora, size):
    """Give the drafter DRAFT a draft vocabulary: it then proposes only the corpora's most frequent
    response tokens, through a smaller output layer (a faster draft step; output is unchanged)."""
    from dflash_trt.train.vocab import set_draft_vocab

    click.echo(set_draft_vocab(draft, corpora, size))


@main.command("pack-corpus")
@click.argument("src", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("dst", type=click.Path(path_type=Path))
@user_errors
def pack_corpus(src, dst):
    """Copy the training corpus SRC to DST without its stored target features (about 4 bytes a token
    instead of 6 KB): small enough to share or commit. train-drafter --corpus DST recomputes them."""
    from dflash_trt.train.corpus import pack_corpus as pack

    count = pack(src, dst)
    click.echo(f"{count} sequences written to {dst} (tokens only)")


@main.command()
@click.argument("model", required=False)
@click.option("--target", default=None, help=TARGET_HELP + " Served instead of a bundle (as MODEL).")
@click.option("--draft", default=None, help=DRAFT_HELP)
@click.option("--speculative-config", default=None,
              help="vLLM's form of --draft and --block-size: a JSON object {\"method\": \"dflash\", \"model\": DRAFT, "
                   "\"num_speculative_tokens\": N} (N drafted tokens: a verify block of N + 1).")
@click.option("--enable-auto-tool-choice", is_flag=True, default=False,
              help="Accepted for vLLM command lines: tool calls are parsed whenever --tool-call-parser knows the "
                   "format (auto: from the chat template).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the OpenAI API listens on (loopback by default).")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1 requests.")
@click.option("--served-model-name", default=None,
              help="The model id clients send and /v1/models lists (default: the bundle's or target's directory name).")
@click.option("--max-batch", "--max-num-seqs", "max_batch", type=int, default=8, show_default=True,
              help="Requests decoded together; more wait for a slot.")
@click.option("--capacity", "--max-model-len", "capacity", type=int, default=None,
              help="Tokens per request (prompt + max_tokens) [default: 4096, or a slots-trt bundle's own].")
@click.option("--block-size", type=int, default=None,
              help="Verify this many tokens every step (default: the engine picks each step's block from measured costs).")
@click.option("--prefill-chunk", type=int, default=0, show_default=True,
              help="Prefill at most this many prompt tokens per step, so a long prompt does not stall the running "
                   "streams (0: whole prompts).")
@click.option("--backend", type=click.Choice(["auto", "torch", "onnxruntime"]), default="auto", show_default=True,
              help="For --target/--draft. " + AUTO_BACKEND_HELP)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="--backend torch: where its models run (default: cuda when PyTorch sees a GPU, else cpu).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None,
              help="--backend torch: its models' dtype (default: bfloat16 on a GPU, float32 on the CPU).")
@click.option("--quant", type=click.Choice(QUANTS), default=None,
              help="For --target: on backend onnxruntime (auto picks it) the target's exported graphs in this "
                   "format (see `export --quant`); on backend torch int4, fp8 or nvfp4, each linear held in the "
                   "format and dequantized per call. Greedy output equals the quantized target's own.")
@click.option("--draft-quant", type=click.Choice(DRAFT_QUANTS), default=None, help=DRAFT_QUANT_HELP)
@click.option("--max-waiting", type=int, default=-1, show_default=True,
              help="Requests that may wait for a slot; one more is refused with 429 and Retry-After (-1: no cap).")
@click.option("--docs/--no-docs", default=True, show_default=True,
              help="Serve the interactive API docs at /docs (/openapi.json is always served).")
@click.option("--draft-rule", type=click.Choice(["point-mass", "drafter"]), default="point-mass", show_default=True,
              help=DRAFT_RULE_HELP)
@click.option("--prefix-caching/--no-prefix-caching", "--enable-prefix-caching/--no-enable-prefix-caching",
              default=True, show_default=True,
              help="A request whose prompt starts with what a finished request's KV slot holds (a conversation's "
                   "earlier turns, a shared system prompt) takes that slot and prefills only the rest; usage "
                   "reports them as prompt_tokens_details.cached_tokens.")
@click.option("--scheduling-policy", type=click.Choice(["fcfs", "priority"]), default="fcfs", show_default=True,
              help="fcfs: requests wait for a slot in arrival order. priority: by each request's `priority` "
                   "(lower first, vLLM's), and a request that finds every slot taken preempts a running one of a "
                   "lower priority, which later prefills what it had again and goes on.")
@click.option("--chat-template", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="A Jinja chat template file used instead of the model's own (e.g. one that renders tools).")
@click.option("--tool-call-parser", type=click.Choice(["auto", "none", "hermes", "qwen3_coder", "llama3_json"]),
              default="auto", show_default=True,
              help="How the model writes tool calls, which /v1/chat/completions returns as tool_calls: hermes "
                   "(<tool_call>{json}</tool_call>: Qwen2.5, Qwen3), qwen3_coder (<function=...> XML: Qwen3.5, "
                   "Qwen3.6, Qwen3-Coder), llama3_json (the reply is {\"name\", \"parameters\"} objects: Llama "
                   "3.1-3.3); auto: from the chat template; none: requests with tools under auto are refused.")
@click.option("--reasoning-parser", type=click.Choice(["none", "qwen3"]), default="none", show_default=True,
              help="qwen3: a chat reply's thinking (up to </think>; Qwen3, Qwen3.5, DeepSeek-R1 style) comes back "
                   "as message.reasoning_content, the rest as content; none: all of it is content.")
@click.option("--responses-store", type=int, default=256, show_default=True,
              help="Responses API responses kept in memory (the most recently used) for previous_response_id and "
                   "GET /v1/responses/{id}; 0: none (store true is then refused).")
@click.option("--trust-request-chat-template", is_flag=True, default=False,
              help="Render a chat request's own chat_template (vLLM's flag; refused without it). Tool calls are "
                   "still parsed in the server's format.")
@click.option("--default-chat-template-kwargs", default=None,
              help="vLLM's: chat template variables (a JSON object, e.g. '{\"enable_thinking\": false}') every "
                   "request gets, under its own chat_template_kwargs.")
@click.option("--generation-config", default="auto", show_default=True, help=GENERATION_CONFIG_HELP)
@click.option("--override-generation-config", default=None, help=OVERRIDE_GENERATION_HELP)
@click.option("--allowed-origins", default=None, callback=_json_strings,
              help="vLLM's CORS option: a JSON list of the origins whose browser pages may call the API, e.g. "
                   "'[\"https://app.example\"]' or '[\"*\"]' [default: none; vLLM's is any].")
@click.option("--allow-credentials", is_flag=True, default=False, help="CORS: let those pages send credentials.")
@click.option("--allowed-methods", default=None, callback=_json_strings, help="CORS: a JSON list [default: any].")
@click.option("--allowed-headers", default=None, callback=_json_strings, help="CORS: a JSON list [default: any].")
@click.option("--ssl-keyfile", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="With --ssl-certfile: the API answers https (TLS), this the certificate's private key.")
@click.option("--ssl-certfile", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="With --ssl-keyfile: the certificate (PEM) the API answers https with.")
@click.option("--root-path", default="",
              help="The path prefix a reverse proxy serves the API under (e.g. /llm): /docs then works through it.")
@click.option("--seed", type=int, default=None,
              help="vLLM's: requests that bring no seed draw from this one, so a restarted server sampling the same "
                   "requests in the same order gives the same tokens [default: random at each start].")
@click.option("--enforce-eager", is_flag=True,
              help="vLLM's: no CUDA graphs on a GPU, each decode step launched kernel by kernel (debugging, profiling).")
@click.option("--disable-log-stats", is_flag=True,
              help="vLLM's: no periodic stats lines (throughput, requests running and waiting, KV cache usage, "
                   "prefix cache hits, speculative decoding's acceptance) in the log.")
@click.option("--log-stats-interval", type=float, default=10.0, show_default=True,
              help="Seconds between stats lines (vLLM's VLLM_LOG_STATS_INTERVAL); an idle interval logs none.")
@click.option("--enable-log-requests", is_flag=True,
              help="vLLM's: log each chat and completion on arrival (its id, sampling fields and prompt).")
@click.option("--max-log-len", type=int, default=None,
              help="vLLM's: a logged prompt is cut to this many characters [default: whole].")
@click.option("--uvicorn-log-level", type=click.Choice(["critical", "error", "warning", "info", "debug", "trace"]),
              default="warning", show_default=True,
              help="vLLM's: the HTTP server's log level; info says each request's status line (vLLM's default).")
@click.option("--disable-uvicorn-access-log", is_flag=True, help="vLLM's: no status line per request at info.")
@click.option("--enable-force-include-usage", is_flag=True,
              help="vLLM's: every streamed chat and completion ends with its usage, as if it asked with "
                   "stream_options.include_usage.")
@click.option("--enable-request-id-headers", is_flag=True,
              help="vLLM's: every reply carries X-Request-Id (the request's own, else a new one that the "
                   "chat's or completion's id carries too).")
@user_errors
def serve(model, target, draft, speculative_config, enable_auto_tool_choice, host, port, api_key, served_model_name,
          max_batch, capacity, block_size, prefill_chunk, backend, device, dtype, quant, draft_quant, max_waiting, docs,
          draft_rule, prefix_caching, scheduling_policy, chat_template, tool_call_parser, reasoning_parser,
          responses_store, trust_request_chat_template, default_chat_template_kwargs, generation_config,
          override_generation_config, allowed_origins, allow_credentials, allowed_methods, allowed_headers,
          ssl_keyfile, ssl_certfile, root_path, seed, enforce_eager, disable_log_stats, log_stats_interval,
          enable_log_requests, max_log_len, uvicorn_log_level, disable_uvicorn_access_log, enable_force_include_usage,
          enable_request_id_headers):
    """Serve MODEL (a bundle or engine bundle directory that export / build wrote; else a target, as
    --target takes it, which vLLM's `serve MODEL` is) with an OpenAI-compatible API (/v1/chat/completions,
    /v1/completions, /v1/responses, Anthropic's /v1/messages and its count_tokens, /v1/models, /health,
    /metrics, /tokenize, /detokenize, /openapi.json, /docs) on Triton Inference Server: one decoupled Triton
    model runs every request through the batching engine."""
    from dflash_trt.serve.config import ServeConfig, is_bundle, speculative_config_fields
    from dflash_trt.serve.server import serve as run_server

    bundle = None
    if model is not None:
        if target is not None:
            raise DFlashError(f"pass MODEL or --target, not both (got {model!r} and {target!r})")
        bundle, target = (Path(model), None) if is_bundle(model) else (None, model)
    if speculative_config is not None:
        draft, block_size = speculative_config_fields(speculative_config, draft, block_size)
    if bundle is None and target is None:
        target = DEFAULT_TARGET
    config = ServeConfig(bundle=bundle, target=target, draft=draft, host=host, port=port, api_key=api_key,
                         model_name=served_model_name, max_batch=max_batch, capacity=capacity, block_size=block_size,
                         prefill_chunk=prefill_chunk, backend=backend, device=device, dtype=dtype, quant=quant,
                         draft_quant=draft_quant, max_waiting=max_waiting, docs=docs, draft_rule=draft_rule,
                         prefix_caching=prefix_caching, scheduling_policy=scheduling_policy,
                         chat_template=chat_template,
                         tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                         responses_store=responses_store, trust_request_chat_template=trust_request_chat_template,
                         default_chat_template_kwargs=default_chat_template_kwargs,
                         generation_config=generation_config, override_generation_config=override_generation_config,
                         allowed_origins=allowed_origins or (), allow_credentials=allow_credentials,
                         allowed_methods=allowed_methods or ("*",), allowed_headers=allowed_headers or ("*",),
                         ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile, root_path=root_path, seed=seed,
                         enforce_eager=enforce_eager, log_stats_s=None if disable_log_stats else log_stats_interval,
                         log_requests=enable_log_requests, max_log_len=max_log_len,
                         request_id_headers=enable_request_id_headers, force_include_usage=enable_force_include_usage,
                         uvicorn_log_level=uvicorn_log_level,
                         access_log=not disable_uvicorn_access_log)
    run_server(config, say=lambda line: (click.echo(line), sys.stdout.flush()))  # flushed: scripts wait for it


@main.command()
@click.argument("bundle", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--target", default=None, help=TARGET_HELP + " Offline mode.")
@click.option("--draft", default=None, help=DRAFT_HELP)
@click.option("--backend", default=None, help="Offline backend: auto (the default), torch, onnxruntime, tensorrt; a "
                   "bundle DIR runs on its own (onnxruntime, or tensorrt for TensorRT engines). " + AUTO_BACKEND_HELP)
@click.option("--base-url", default=None, help="Benchmark an OpenAI-compatible server instead (e.g. http://127.0.0.1:8000/v1).")
@click.option("--baseline-url", default=None, help="Server mode: an autoregressive server to compare against.")
@click.option("--model", default=None, help="Server mode: model name (default: the server's first).")
@click.option("--api-key", envvar="DFLASH_TRT_API_KEY", default=None,
              help="Server mode: the servers' API key (sent as a bearer token; never recorded). "
                   "Also read from DFLASH_TRT_API_KEY.")
@click.option("--dataset", "datasets", default="humaneval,mt-bench", show_default=True, callback=_csv(str),
              help="Comma-separated: humaneval, mt-bench, gsm, math.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Your own prompts: JSONL with a 'prompt' field per line.")
@click.option("--num-prompts", type=int, default=10, show_default=True, help="First N prompts of each dataset.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--block-size", "block_sizes", default="4", show_default=True, callback=_csv(_block_size),
              help="Comma-separated block sizes; auto: each step chooses its block from measured costs and "
                   "acceptance (adaptive speculation, up to the drafter's block).")
@click.option("--temperature", "temperatures", default="0", show_default=True, callback=_csv(float), help="Comma-separated temperatures.")
@click.option("--concurrency", default="1", show_default=True, callback=_csv(int), help="Comma-separated requests in flight (offline: the core batches them; server: concurrent clients).")
@click.option("--draft-rule", "draft_rules", default="point-mass", show_default=True, callback=_csv(str),
              help="Offline: comma-separated draft rules (point-mass, drafter), each run on every setting; drafter "
                   "needs fixed block sizes.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Offline --backend torch (auto picks it on a GPU): where its models run (default: cuda when "
                   "PyTorch sees a GPU, else cpu).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None,
              help="Offline --backend torch: its models' dtype (default: bfloat16 on a GPU, float32 on the CPU).")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="Offline: a prompt that starts with a finished request's tokens (a chat template's default "
                   "system prompt, say) reuses its KV slot and prefills only the rest.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--baseline/--no-baseline", default=True, show_default=True, help="Also run the autoregressive baseline (speedup, greedy check).")
@click.option("--json-out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the full record here.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write a PNG: throughput, speedup, τ histogram.")
@user_errors
def bench(bundle, target, draft, backend, base_url, baseline_url, model, api_key, datasets, prompts_file, num_prompts,
          max_tokens, block_sizes, temperatures, concurrency, draft_rules, device, dtype, prefix_caching, seed, baseline,
          json_out, plot):
    """Throughput, speedup over autoregressive decoding, and acceptance, per dataset; prints a table.

    Offline (default): the pair (or the exported BUNDLE, on onnxruntime) runs in this process, DFlash
    and speculative=False on the same prompts after a warm-up. Server: --base-url sends the same prompts to a running OpenAI-compatible server.
    In greedy mode every DFlash output is checked against the baseline; a mismatch exits with status 3.
    """
    from dflash_trt.bench import report
    from dflash_trt.bench.run import BenchConfig, run_bench

    config = BenchConfig(
        datasets=datasets, prompts_file=prompts_file, num_prompts=num_prompts, max_tokens=max_tokens,
        block_sizes=block_sizes, temperatures=temperatures, concurrency=concurrency, draft_rules=draft_rules, seed=seed,
        baseline=baseline,
        bundle=bundle, target=target, draft=draft, backend=backend, device=device, dtype=dtype,
        prefix_caching=prefix_caching, base_url=base_url,
        baseline_url=baseline_url, model=model,
    )
    if api_key and not base_url:
        raise DFlashError("--api-key is for server mode (--base-url)")
    results = run_bench(config, api_key)
    click.echo(report.table(results))
    click.echo(report.acceptance_lines(results))
    if any(r.prefix_cache_reset is False for r in results):
        click.echo("note: a server has no prefix cache reset (/reset_prefix_cache, /flush_cache): the warm-up's "
                   "prompts may be served from its cache when timed (cached column)")
    for name, source in report.record_sources(config).items():
        click.echo(f"{name}: {source}")
    if json_out:
        report.write_json(report.record(config, results, invoked_command()), json_out)
        click.echo(f"record written to {json_out}", err=True)
    if plot:
        report.plot(results, plot)
        click.echo(f"plot written to {plot}", err=True)
    wrong = [r for r in results if r.mismatches]
    for r in wrong:
        click.secho(f"MISMATCH: {r.dataset} B={r.block_size}: {len(r.mismatches)} greedy DFlash outputs differ from "
                    f"the baseline (first: request {r.mismatches[0]['request']}); the speedup is not valid",
                    fg="red", bold=True, err=True)
    if wrong:
        sys.exit(3)


@main.command("bench-report")
@click.argument("record", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write a PNG: throughput, speedup, τ histogram.")
@user_errors
def bench_report(record, plot):
    """Print the table of a saved bench RECORD (--json-out) again, and optionally plot it."""
    from dflash_trt.bench import report

    results = report.load_results(record)
    click.echo(report.table(results))
    click.echo(report.acceptance_lines(results))
    if plot:
        report.plot(results, plot)
        click.echo(f"plot written to {plot}", err=True)


if __name__ == "__main__":
    sys.exit(main())
