"""ServeConfig: what `dflash-trt serve` runs and where (one field per CLI option, plus the limits)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError

TRITON_MODEL = "dflash"  # the one model in the Triton repository (Triton's /v2/models/dflash/...)


def stub_numpy_dir() -> Path:
    """Where scripts/setup.sh puts numpy 1.26 for Triton's Python stub only (research/trt.md §8: the
    2.51 stub garbles string tensors with numpy 2; the rest of the environment keeps numpy 2)."""
    return Path(sys.prefix) / "triton-stub"


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path | None = None  # what export/build wrote; or target + draft
    target: str | None = None
    draft: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_batch: int = 8
    capacity: int | None = None  # tokens per request (prompt + max_tokens); None: 4096, or a slots-trt bundle's own
    block_size: int | None = None  # None: the engine picks each step's block (adaptive); N pins it
    prefill_chunk: int = 0  # prompt tokens prefilled per step (0: whole prompts)
    backend: str = "auto"  # for target + draft: LLM's backend (auto: runtime/llm.py resolve_backend)
    device: str | None = None  # for target + draft, LLM's placement and quantization (None: its defaults)
    dtype: str | None = None
    quant: str | None = None
    draft_quant: str | None = None
    max_waiting: int = -1  # requests that may wait for a slot; one more gets a 429 (-1: no cap)
    model_name: str | None = None  # what /v1/models lists (default: the bundle's or target's directory name)
    max_body_bytes: int = 1 << 20
    docs: bool = True  # /docs (Swagger UI)
    draft_rule: str = "point-mass"  # T>0 drafts (runtime/ort_executor.py DRAFT_RULES); "drafter" needs block_size
    prefix_caching: bool = True  # a prompt starting with what a finished request's slot holds reuses it
    scheduling_policy: str = "fcfs"  # runtime/batch_runner.py SCHEDULING_POLICIES: "priority" honours a request's priority
    chat_template: Path | None = None  # a Jinja file in place of the checkpoint's chat template
    tool_call_parser: str = "auto"  # how replies write tool calls (tool_calls.PARSERS); auto: from the template
    reasoning_parser: str = "none"  # qwen3: a chat reply's <think> block is its reasoning_content
    responses_store: int = 256  # Responses API responses kept for previous_response_id (0: none)
    trust_request_chat_template: bool = False  # vLLM's: a request's own chat_template renders its prompt
    # vLLM's: chat template variables every request gets under its own chat_template_kwargs (a JSON object)
    default_chat_template_kwargs: str | None = None
    # vLLM's: where a request's sampling defaults come from ("auto": the model's generation_config.json;
    # "vllm": none; a directory holding one), and a JSON object of some set over them
    generation_config: str = "auto"
    override_generation_config: str | None = None
    # CORS, as vLLM's options name it (openai_api.FrontSettings): no origin by default
    allowed_origins: tuple[str, ...] = ()
    allow_credentials: bool = False
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    # TLS (vLLM's --ssl-keyfile / --ssl-certfile): the API answers https when both are given
    ssl_keyfile: Path | None = None
    ssl_certfile: Path | None = None
    root_path: str = ""  # vLLM's --root-path: the prefix a proxy serves the API under (/docs links carry it)
    seed: int | None = None  # vLLM's --seed: what requests without a seed draw from (None: random per start)
    # vLLM's periodic stats lines (stats_log.py) every this many seconds; None: --disable-log-stats
    log_stats_s: float | None = 10.0
    enforce_eager: bool = False  # vLLM's --enforce-eager: no CUDA graphs on a GPU
    log_requests: bool = False  # vLLM's --enable-log-requests: each chat and completion said on arrival
    max_log_len: int | None = None  # vLLM's: a logged prompt cut to this many characters (None: whole)
    request_id_headers: bool = False  # vLLM's --enable-request-id-headers: replies carry X-Request-Id
    force_include_usage: bool = False  # vLLM's --enable-force-include-usage: every stream ends with its usage
    # the HTTP server's own log (vLLM's --uvicorn-log-level; info adds a line per request, unless
    # --disable-uvicorn-access-log)
    uvicorn_log_level: str = "warning"
    access_log: bool = True

    def __post_init__(self):
        if self.bundle is not None and (self.target or self.draft):
            raise DFlashError("pass either BUNDLE or --target/--draft, not both")
        if self.bundle is None and not self.target:
            raise DFlashError("nothing to serve: pass BUNDLE or --target T --draft D")
        if self.bundle is not None and not Path(self.bundle).is_dir():
            raise DFlashError(f"bundle {self.bundle} is not a directory")
        if self.backend not in ("auto", "torch", "onnxruntime"):
            raise DFlashError(f"--backend must be auto, torch or onnxruntime, got {self.backend!r}")
        if self.bundle is not None and self.backend != "auto":
            raise DFlashError("--backend is for --target/--draft; a BUNDLE runs on its own executor")
        from dflash_trt.runtime.llm import AUTO, BUNDLE_PLACED, placed_backend

        placed = (self.device, self.dtype, self.quant, self.draft_quant)
        if self.bundle is not None and any(placed):
            raise DFlashError(BUNDLE_PLACED)
        if self.bundle is None and any(placed):  # as the Triton model's LLM will resolve and check them
            placed_backend(self.backend, self.target, self.draft or AUTO, *placed)
        from dflash_trt.runtime.ort_executor import DRAFT_RULES, SlotBundle, draft_rule_refusal

        if self.draft_rule not in DRAFT_RULES:
            raise DFlashError(f"--draft-rule must be one of {', '.join(DRAFT_RULES)}, got {self.draft_rule!r}")
        if self.draft_rule == "drafter" and self.block_size is None:
            raise DFlashError("--draft-rule drafter needs --block-size: its tokens depend on where each block starts")
        if self.bundle is not None:  # a bundle no executor runs is refused here, before Triton starts
            manifest = SlotBundle(self.bundle).manifest
            refusal = draft_rule_refusal(self.draft_rule, manifest)
            if refusal:
                raise DFlashError(refusal)
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise DFlashError(f"--max-batch must be an integer >= 1, got {self.max_batch!r}")
        if not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 0:
            raise DFlashError(f"--prefill-chunk must be an integer >= 0 (0: whole prompts), got {self.prefill_chunk!r}")
        if self.capacity is not None and (not isinstance(self.capacity, int) or self.capacity < 2):
            raise DFlashError(f"--capacity must be an integer >= 2, got {self.capacity!r}")
        if self.block_size is not None and self.block_size < 2:
            raise DFlashError(f"--block-size must be >= 2, got {self.block_size}")
        from dflash_trt.runtime.batch_runner import SCHEDULING_POLICIES

        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise DFlashError(f"--scheduling-policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                              f"got {self.scheduling_policy!r}")
        if not isinstance(self.max_waiting, int) or self.max_waiting < -1:
            raise DFlashError(f"--max-waiting must be an integer >= -1 (-1: no cap), got {self.max_waiting!r}")
        from dflash_trt.serve.tool_calls import PARSERS

        if self.tool_call_parser not in ("auto", "none", *PARSERS):
            raise DFlashError(f"--tool-call-parser must be one of auto, none, {', '.join(PARSERS)}, "
                              f"got {self.tool_call_parser!r}")
        from dflash_trt.serve.reply_text import REASONING_PARSERS

        if self.reasoning_parser not in ("none", *REASONING_PARSERS):
            raise DFlashError(f"--reasoning-parser must be none or {' or '.join(REASONING_PARSERS)}, "
                              f"got {self.reasoning_parser!r}")
        if self.chat_template is not None:
            try:
                Path(self.chat_template).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise DFlashError(f"--chat-template {self.chat_template}: cannot read it as text ({err})") from None
        if self.default_chat_template_kwargs is not None:
            from dflash_trt.serve.requests import RequestError, template_kwargs

            try:
                template_kwargs(self.default_chat_template_kwargs)
            except RequestError as err:
                raise DFlashError(f"--default-chat-template-kwargs: {err.message}") from None
        from dflash_trt.models.generation_defaults import check_setting, parse_overrides

        check_setting(self.generation_config)
        parse_overrides(self.override_generation_config)
        if not isinstance(self.responses_store, int) or self.responses_store < 0:
            raise DFlashError(f"--responses-store must be an integer >= 0, got {self.responses_store!r}")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise DFlashError("--ssl-keyfile and --ssl-certfile go together: pass both for https, or neither")
        if self.ssl_certfile is not None:
            import ssl

            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            except (OSError, ssl.SSLError) as err:
                raise DFlashError(f"--ssl-certfile {self.ssl_certfile} with --ssl-keyfile {self.ssl_keyfile}: not a "
                                  f"certificate and its key ({err})") from None
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise DFlashError(f"--root-path must start with / and not end with one (e.g. /llm), got {self.root_path!r}")
        if self.seed is not None:
            from dflash_trt.runtime.llm import engine_seeds

            engine_seeds(self.seed)  # its range, as the engine takes it
        if self.max_log_len is not None and self.max_log_len < 0:
            raise DFlashError(f"--max-log-len must be >= 0, got {self.max_log_len}")
        if self.log_stats_s is not None and not self.log_stats_s > 0:
            raise DFlashError(f"--log-stats-interval must be a number of seconds > 0, got {self.log_stats_s!r}")
        if not 0 <= self.port <= 65535:
            raise DFlashError(f"--port must be in 0..65535, got {self.port}")

    @property
    def served_name(self) -> str:
        if self.model_name:
            return self.model_name
        source = str(self.bundle) if self.bundle is not None else str(self.target)
        return Path(source.rstrip("/")).name or source

    def model_parameters(self) -> dict[str, str]:
        """The Triton model's parameters (config.pbtxt): everything model.py needs to build the engine."""
        return {
            "bundle": "" if self.bundle is None else str(Path(self.bundle).resolve()),
            "target": _local(self.target),
            "draft": _local(self.draft),
            "max_batch": str(self.max_batch),
            "capacity": "" if self.capacity is None else str(self.capacity),
            "block_size": "" if self.block_size is None else str(self.block_size),
            "prefill_chunk": str(self.prefill_chunk),
            "backend": self.backend,
            **{name: getattr(self, name) or "" for name in ("device", "dtype", "quant", "draft_quant")},
            "max_waiting": str(self.max_waiting),
            "served_name": self.served_name,
            "draft_rule": self.draft_rule,
            "prefix_caching": "1" if self.prefix_caching else "0",
            "scheduling_policy": self.scheduling_policy,
            "chat_template": "" if self.chat_template is None else str(Path(self.chat_template).resolve()),
            "default_chat_template_kwargs": self.default_chat_template_kwargs or "",
            "generation_config": self.generation_config if self.generation_config in ("auto", "vllm")
            else str(Path(self.generation_config).resolve()),
            "override_generation_config": self.override_generation_config or "",
            "seed": "" if self.seed is None else str(self.seed),
            "enforce_eager": "1" if self.enforce_eager else "0",
        }

    def sampling_defaults(self) -> dict:
        """The sampling defaults the Triton model's LLM will apply (models/generation_defaults.py), read here
        first: a bad value is refused before Triton starts, and serve says what they are."""
        from dflash_trt.models.checkpoints import resolve_target
        from dflash_trt.models.generation_defaults import sampling_defaults

        source = self.bundle if self.bundle is not None else resolve_target(self.target)
        return sampling_defaults(source, self.generation_config, self.override_generation_config)


def is_bundle(path: str | Path) -> bool:
    """Whether `path` is a directory export or build wrote (its manifest there), not a checkpoint."""
    from dflash_trt.engines.manifest import is_engine_bundle
    from dflash_trt.export.manifest import MANIFEST

    return (Path(path) / MANIFEST).is_file() or is_engine_bundle(path)


def speculative_config_fields(text: str, draft: str | None, block_size: int | None) -> tuple[str | None, int | None]:
    """vLLM's --speculative-config JSON -> (draft, block size) (runtime/vllm_names.py)."""
    import json

    from dflash_trt.runtime.vllm_names import speculative_fields

    try:
        fields = json.loads(text)
    except ValueError:
        raise DFlashError(f"--speculative-config is not valid JSON: {text!r}") from None
    return speculative_fields(fields, draft, block_size, "--speculative-config")


def _local(source: str | None) -> str:
    """A local directory as an absolute path (the stub may not share our working directory); ids as given."""
    if not source:
        return ""
    return str(Path(source).resolve()) if Path(source).is_dir() else source
