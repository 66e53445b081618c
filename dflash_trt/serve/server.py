"""`dflash-trt serve`: check the inputs, start tritonserver with the repository, then the OpenAI front.

Two processes on loopback: tritonserver (the engine lives in its Python stub) and this one (FastAPI
under uvicorn). SIGTERM or Ctrl-C: uvicorn stops accepting and lets in-flight requests finish, then
tritonserver gets SIGTERM (its model's finalize drains the engine), then the temp directory goes.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.serve.config import ServeConfig

DRAIN_S = 60  # how long in-flight requests may take to finish on SIGTERM
READY_S = 900  # model load inside Triton (weights, engines)


def check_inputs(config: ServeConfig) -> dict:
    """What the model's initialize would refuse, refused here in one line, before Triton starts ->
    how the front reads replies (`front_options`)."""
    if config.bundle is not None:
        from dflash_trt.runtime.engine_bundles import open_bundle

        open_bundle(config.bundle)
    else:
        from dflash_trt.models.checkpoints import check_pair
        from dflash_trt.models.embedded import default_drafter

        draft = config.draft or default_drafter(config.target)
        if draft is None:
            raise DFlashError(f"no drafter for target '{config.target}': pass --draft DIR")
        check_pair(config.target, draft)
    return front_options(config)


def front_options(config: ServeConfig) -> dict:
    """FrontSettings' tool_parser (--tool-call-parser, or for auto the format the chat template
    teaches: tool_calls.detect_parser), thinking (with --reasoning-parser: whether the template's
    generation prompt, under a request's chat_template_kwargs, leaves a think block open) and token_text
    (the tokenizer's, None without one)."""
    from dflash_trt.models.chat import ENDINGS
    from dflash_trt.models.checkpoints import resolve_target
    from dflash_trt.models.tokenizers import load_tokenizer, token_text
    from dflash_trt.serve.reply_text import opens_thinking
    from dflash_trt.serve.tool_calls import detect_parser

    tokenizer = load_tokenizer(str(config.bundle) if config.bundle is not None else resolve_target(config.target))
    if tokenizer is None and (config.chat_template is not None or config.reasoning_parser != "none"):
        raise DFlashError("--chat-template and --reasoning-parser need the model's tokenizer, and this model has none")
    if config.chat_template is not None:
        tokenizer.chat_template = Path(config.chat_template).read_text(encoding="utf-8")
    template = tokenizer.chat_template if tokenizer is not None else None
    parser = {"none": None, "auto": detect_parser(template if isinstance(template, str) else None)}.get(
        config.tool_call_parser, config.tool_call_parser)
    thinking = None
    if config.reasoning_parser != "none":
        @functools.lru_cache(maxsize=64)
        def rendered(kwargs: str, template: str | None) -> bool:
            try:
                prompt = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], add_generation_prompt=True,
                                                       tokenize=False, chat_template=template, **json.loads(kwargs))
            except Exception:  # the Triton model refuses such kwargs and templates itself, naming them
                return False
            return opens_thinking(prompt)

        defaults = json.loads(config.default_chat_template_kwargs or "{}")

        def thinking(kwargs: dict, template: str | None = None) -> bool:
            """Whether the assistant's turn, opened, opens a think block (`template`: a request's own)."""
            variables = {**defaults, **kwargs}
            return rendered(json.dumps({k: v for k, v in variables.items() if k not in ENDINGS}, sort_keys=True),
                            template)
    text = functools.partial(token_text, tokenizer) if tokenizer is not None else None
    return {"tool_parser": parser, "thinking": thinking, "token_text": text}


def sampling_line(defaults: dict) -> str:
    """What a request gets for the sampling fields it leaves out (vLLM says so at start too)."""
    from dflash_trt.serve.requests import SERVER_DEFAULTS

    shown = ", ".join(f"{name} {value}" for name, value in {**SERVER_DEFAULTS, **defaults}.items())
    return f"default sampling (a request's own fields win; --generation-config): {shown}"


def bind(host: str, port: int) -> socket.socket:
    """The front's listening socket, bound before anything starts: a taken port is one line."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise DFlashError(f"cannot listen on {host}:{port} ({err.strerror}): is another server there? "
                          "pass --port") from None
    sock.listen(2048)
    return sock


def serve(config: ServeConfig, say: Callable[[str], None] = print) -> None:
    import uvicorn

    from dflash_trt.serve.openai_api import FrontSettings, create_app
    from dflash_trt.serve.repository import write_repository
    from dflash_trt.serve.stats_log import STATS_INTERVAL_S
    from dflash_trt.serve.triton import find_triton, start_triton
    from dflash_trt.serve.triton_client import TritonClient

    options = check_inputs(config)
    defaults = config.sampling_defaults()
    sock = bind(config.host, config.port)
    try:
        install = find_triton()
    except DFlashError:
        sock.close()
        raise
    workdir = Path(tempfile.mkdtemp(prefix="dflash-serve-"))
    triton = None
    try:
        repository = write_repository(workdir / "repository", config)
        triton = start_triton(repository, workdir, install, exit_timeout_s=DRAIN_S)
        triton.wait_ready(READY_S)
        client = TritonClient(triton.url, triton.metrics_url)
        cors = {name: getattr(config, name) for name in ("allowed_origins", "allow_credentials", "allowed_methods",
                                                         "allowed_headers")}
        app = create_app(FrontSettings(config.served_name, config.api_key, config.max_body_bytes, config.docs,
                                       drain_s=DRAIN_S, responses_store=config.responses_store,
                                       trust_request_chat_template=config.trust_request_chat_template, **cors,
                                       stats_log=None if config.log_stats_s is None else say,
                                       stats_interval_s=config.log_stats_s or STATS_INTERVAL_S,
                                       request_log=say if config.log_requests else None,
                                       max_log_len=config.max_log_len, request_id_headers=config.request_id_headers,
                                       force_include_usage=config.force_include_usage,
                                       **options),
                           client)
        tls = {"ssl_keyfile": config.ssl_keyfile, "ssl_certfile": config.ssl_certfile}
        server = uvicorn.Server(uvicorn.Config(app, log_level=config.uvicorn_log_level, access_log=config.access_log,
                                               timeout_graceful_shutdown=DRAIN_S, root_path=config.root_path, **tls))
        host, port = sock.getsockname()[:2]
        scheme = "https" if config.ssl_certfile is not None else "http"
        say(sampling_line(defaults))
        # the ready line last: scripts wait for it
        say(f"serving '{config.served_name}' at {scheme}://{host}:{port}/v1 (Triton at {triton.url}); tool calls: "
            f"{options['tool_parser'] or 'none'}; reasoning: {config.reasoning_parser}")
        _quiet_after_capture()
        server.run(sockets=[sock])
    finally:
        sock.close()
        if triton is not None:
            triton.stop(DRAIN_S)
        shutil.rmtree(workdir, ignore_errors=True)


def _quiet_after_capture() -> None:
    """uvicorn handles SIGTERM/SIGINT while it runs and re-raises them once stopped; by then we only
    want to stop Triton and clean up, so the handlers it restores do nothing."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
