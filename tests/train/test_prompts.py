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


def test_assistant_prompts_are_distinct_seeded_and_edit_stdlib_prose():
    many = prompts.assistant_prompts(600, seed=0)
    assert len(many) == len(set(many)) == 600
    assert many == prompts.assistant_prompts(600, seed=0)
    assert many != prompts.assistant_prompts(600, seed=1)
    edits = [p for p in many if p.split("\n\n")[0].rstrip(":") in {t.split(":")[0] for t in prompts.EDIT_TEMPLATES}]
    assert len(edits) == 100  # one in six
    paragraphs = set(prompts._stdlib_paragraphs(__import__("random").Random(0), 10**6))
    assert all(edit.split("\n\n", 1)[1] in paragraphs for edit in edits)


def test_stdlib_sources_exclude_installed_packages():
    files = prompts._stdlib_files()
    assert files and not any({"site-packages", "dist-packages", "test", "tests"} & set(f.parts) for f in files)
