"""SGLang's native /generate in-process over the stand-in Triton client of test_front.py (it answers "abc",
token ids 0, 1, 2, or a seeded request its seed's digits): each prompt and sample a completion of its own
with SGLang's defaults and names, answered as {text, output_ids, meta_info}, a list for a batch, or
streamed as cumulative chunks."""

import json

import pytest
from fastapi.testclient import TestClient
from test_front import USAGE, FakeTriton

from dflash_trt.serve.openai_api import FrontSettings, create_app


@pytest.fixture
def served():
    triton = FakeTriton()
    return TestClient(create_app(FrontSettings("tiny"), triton)), triton


def sampling(triton, k=-1) -> dict:
    return json.loads(triton.requests[k]["sampling_parameters"])


def test_a_text_prompt_is_a_completion_with_sglang_s_defaults(served):
    front, triton = served
    answer = front.post("/generate", json={"text": "hi", "rid": "r1"}).json()
    (asked,) = triton.requests
    assert asked["text_input"] == "hi" and "messages" not in asked  # no chat template
    # SGLang's 128 new tokens; the temperature left to the Triton model (the generation config's, else 1)
    assert sampling(triton) == {"max_tokens": 128}
    assert asked["return_token_ids"] is True
    assert answer == {"text": "abc", "output_ids": [0, 1, 2], "meta_info": {
        "id": "r1", "finish_reason": {"type": "length", "length": 3}, "prompt_tokens": USAGE["prompt_tokens"],
        "completion_tokens": 3, "cached_tokens": USAGE["cached_tokens"], "spec_verify_ct": 2,
        "spec_accept_length": 1.5}}


def test_a_batch_and_n_samples_are_a_list_prompt_by_prompt_each_sample_seeded_apart(served):
    front, triton = served
    answers = front.post("/generate", json={"input_ids": [[5, 6], [7]], "rid": ["a", "b"],
                                            "sampling_params": {"n": 2, "sampling_seed": 40}}).json()
    assert [a["text"] for a in answers] == ["040", "041", "040", "041"]  # the stand-in answers its seed
    assert [a["meta_info"]["id"] for a in answers] == ["a", "a", "b", "b"]
    assert [r["input_ids"] for r in triton.requests] == [[5, 6], [5, 6], [7], [7]]
    assert [sampling(triton, k)["seed"] for k in range(4)] == [40, 41, 40, 41]


def test_a_batch_may_send_each_prompt_its_own_sampling_params(served):
    front, triton = served
    answers = front.post("/generate", json={"input_ids": [[5, 6], [7]], "sampling_params": [
        {"max_new_tokens": 3, "sampling_seed": 7, "n": 2}, {"max_new_tokens": 5, "temperature": 0}]}).json()
    assert [a["text"] for a in answers] == ["007", "008", "abc"]
    assert [r["input_ids"] for r in triton.requests] == [[5, 6], [5, 6], [7]]
    assert [sampling(triton, k) for k in range(3)] == [
        {"max_tokens": 3, "seed": 7}, {"max_tokens": 3, "seed": 8}, {"max_tokens": 5, "temperature": 0}]
    refused = front.post("/generate", json={"input_ids": [[5, 6], [7]], "sampling_params": [{}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "sampling_params"
    assert "1 sampling_params for 2 prompts" in refused.json()["error"]["message"]


def test_sglang_s_sampling_names_reach_the_engine(served):
    front, triton = served
    schema = {"type": "object"}
    front.post("/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 7, "min_new_tokens": 2, "temperature": 0, "top_k": 5, "stop": ["x"], "no_stop_trim": True,
        "repetition_penalty": 1.1, "thinking_token_budget": 3}})
    assert sampling(triton) == {"max_tokens": 7, "min_tokens": 2, "temperature": 0, "top_k": 5, "stop": ["x"],
                                "include_stop_str_in_output": True, "repetition_penalty": 1.1,
                                "thinking_token_budget": 3}
    for grammar, structured in [({"json_schema": json.dumps(schema)}, {"json": schema}),
                                ({"regex": "[a-c]+"}, {"regex": "[a-c]+"}),
                                ({"ebnf": 'root ::= "a"'}, {"grammar": 'root ::= "a"'})]:
        front.post("/generate", json={"text": "hi", "sampling_params": grammar})
        assert sampling(triton)["structured_output"] == structured
    refused = front.post("/generate", json={"text": "hi", "sampling_params": {"regex": "a", "min_new_tokens": 2}})
    assert refused.json()["error"]["param"] == "sampling_params.regex"
    assert refused.json()["error"]["message"].startswith("regex: ")  # SGLang's name, not the completion's


def test_a_stream_is_cumulative_chunks_then_done(served):
    front, _ = served
    with front.stream("POST", "/generate", json={"text": "hi", "stream": True}) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert [(c["text"], c["output_ids"]) for c in chunks] == [("a", [0]), ("ab", [0, 1]), ("abc", [0, 1, 2]),
                                                              ("abc", [0, 1, 2])]
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, None, {"type": "length", "length": 3}]
    assert chunks[-1]["meta_info"]["spec_verify_ct"] == 2


def test_a_streamed_batch_interleaves_each_answer_s_cumulative_chunks_by_index(served):
    """SGLang's form: every chunk names its answer's index (prompt by prompt, each prompt's samples in a
    row); each index's chunks are cumulative and end with its finish reason; one [DONE] at the end; the
    last chunks are the whole answers."""
    front, triton = served
    body = {"input_ids": [[5, 6], [7]], "rid": ["a", "b"], "sampling_params": {"n": 2, "sampling_seed": 40}}
    whole = front.post("/generate", json=body).json()
    with front.stream("POST", "/generate", json={**body, "stream": True}) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]" and "[DONE]" not in lines[:-1]
    chunks = [json.loads(line) for line in lines[:-1]]
    by_index = {k: [c for c in chunks if c["index"] == k] for k in range(4)}
    assert {c["index"] for c in chunks} == {0, 1, 2, 3}
    for k, answer in enumerate(whole):
        texts = [c["text"] for c in by_index[k]]
        assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
        last = by_index[k][-1]
        assert (last["text"], last["output_ids"], last["meta_info"]["id"]) == (
            answer["text"], answer["output_ids"], answer["meta_info"]["id"])
        assert last["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"]
        assert [c["meta_info"]["finish_reason"] for c in by_index[k][:-1]] == [None] * (len(by_index[k]) - 1)


def test_a_streamed_batch_with_a_refused_prompt_is_one_4xx_and_closes_the_others(served):
    front, triton = served
    refused = front.post("/generate", json={"text": ["hi", "a long prompt"], "stream": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "text"
    assert triton.closed == 1  # the prompt it took, closed (the refused one never streamed)


@pytest.mark.parametrize("body, param", [
    ({"text": "hi", "input_ids": [1]}, "text"), ({}, "text"),
    ({"text": "hi", "sampling_params": {"top_q": 1}}, "sampling_params.top_q"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
    ({"text": "hi", "sampling_params": {"regex": "("}}, "sampling_params.regex"),
    ({"text": "hi", "sampling_params": {"json_schema": "{"}}, "sampling_params.json_schema"),
    ({"text": ["a", "b"], "rid": ["x"]}, "rid"),
    ({"text": "hi", "return_logprob": True, "return_text_in_logprobs": True}, "return_text_in_logprobs"),  # no tokenizer
    ({"text": "hi", "stream": True, "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
    ({"text": "a long prompt"}, "text"), ({"input_ids": [1, 2], "sampling_params": {"min_p": 2}}, "sampling_params.min_p"),
])
def test_what_generate_cannot_honour_is_a_400_naming_the_field(served, body, param):
    front, triton = served
    response = front.post("/generate", json=body)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == param
    assert all("long" in str(r.get("text_input")) for r in triton.requests)  # none ran but the refused prompt


@pytest.mark.parametrize("with_text", [False, True])
def test_logprob_entries_name_their_token_by_id_and_with_return_text_in_logprobs_by_text(with_text):
    """SGLang's [logprob, id, text]: the text is the token's own, decoded alone by the model's tokenizer
    (the front's token_text), and null unless asked for."""
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny", token_text=lambda t: f"<{t}>"), triton))
    answer = front.post("/generate", json={"input_ids": [4, 5], "return_logprob": True, "top_logprobs_num": 1,
                                           "logprob_start_len": 0, "return_text_in_logprobs": with_text}).json()
    text = (lambda t: f"<{t}>") if with_text else (lambda t: None)
    meta = answer["meta_info"]
    assert meta["input_token_logprobs"] == [[None, 4, text(4)], [-0.5, 5, text(5)]]
    assert meta["input_top_logprobs"] == [None, [[-0.1, 100, text(100)]]]


def test_one_refused_prompt_of_a_batch_closes_the_others(served):
    front, triton = served
    response = front.post("/generate", json={"text": ["hi", "a long prompt", "there"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "text"
    assert triton.closed == 2  # the two the stand-in answers: closed, not left running
