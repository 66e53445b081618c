"""Offline training prompts: code tasks cycle templates past the number of stdlib functions."""

from dflash_trt.train import prompts


def test_code_prompts_reuse_functions_under_new_templates_and_never_repeat(monkeypatch):
    functions = [(f"f{i}", "(x)", f"Does thing {i} to x.", f'def f{i}(x):\n    """Does thing {i}."""') for i in range(3)]
    monkeypatch.setattr(prompts, "_stdlib_functions", lambda rng, limit: functions)
    few = prompts.code_prompts(2, seed=0)
    assert len(few) == 2
    more = prompts.code_prompts(10, seed=0)
    assert len(set(more)) == 10
    every = prompts.code_prompts(1000, seed=0)
    assert len(every) == len(set(every)) == 3 * len(prompts.CODE_TEMPLATES)  # all (function, template) pairs
    for i in range(3):
        assert sum(f"f{i}" in p for p in every) == len(prompts.CODE_TEMPLATES)
