"""The real server behind TLS (vLLM's --ssl-keyfile / --ssl-certfile), with CORS for one origin and a
proxy's root path: the OpenAI client gets its reply over https, a plain http request gets none, a page
of the allowed origin passes its preflight, and /openapi.json names the root path."""

import shutil
import subprocess

import httpx
import pytest
from server_process import need_triton, start_server

APP = "https://app.example"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 -> (key file, certificate file)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed here (it makes the test's certificate)")
    root = tmp_path_factory.mktemp("tls")
    key, cert = root / "key.pem", root / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return key, cert


@pytest.fixture(scope="module")
def server(tiny_pairs, certificate):
    need_triton()
    target, draft = map(str, tiny_pairs["qwen3"])
    started = start_server(["--target", target, "--draft", draft, "--backend", "torch", "--max-model-len", "128",
                            "--ssl-keyfile", str(certificate[0]), "--ssl-certfile", str(certificate[1]),
                            "--allowed-origins", f'["{APP}"]', "--root-path", "/llm"])
    yield started
    started.stop()


def test_the_openai_client_is_answered_over_https_and_plain_http_is_not(server, certificate):
    from openai import OpenAI

    assert server.url.startswith("https://127.0.0.1:")
    client = OpenAI(base_url=server.url, api_key="none", max_retries=0,
                    http_client=httpx.Client(verify=str(certificate[1]), timeout=120))
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url.replace("https://", "http://") + "/models", timeout=10)


def test_the_allowed_origin_passes_its_preflight_and_the_docs_name_the_root_path(server, certificate):
    preflight = httpx.options(f"{server.url}/chat/completions", verify=str(certificate[1]), timeout=10, headers={
        "Origin": APP, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == APP
    schema = httpx.get(f"{server.root}/openapi.json", verify=str(certificate[1]), timeout=10).json()
    assert schema["servers"] == [{"url": "/llm"}]
