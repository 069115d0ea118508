"""Cost before work: ``--dry-run`` prints the plan and the estimate without loading the
model, and the estimate is the hand computation from the measured table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from mechlingo.analyses.decoders.registry import DecoderUse
from mechlingo.cli import cost as plans
from mechlingo.cli import main
from mechlingo.core import costs
from mechlingo.core.costs import SECONDS_PER_ITEM as S
from mechlingo.data import load_facts


@pytest.fixture(scope="module")
def inputs(tiny, tmp_path_factory) -> Path:
    """Facts, parallel lines, a text file and a vectors folder of the tiny model."""
    from mechlingo.interventions import SteeringVector

    root = tmp_path_factory.mktemp("inputs")
    d_model, n = int(tiny.cfg.d_model), int(tiny.cfg.n_layers)
    for part in ("task", "diff"):
        SteeringVector(torch.ones(n, d_model), None, 1.0).save(root / "vec" / part, tiny)
    (root / "vec" / "build.json").write_text(json.dumps({"unit": "resid"}))
    (root / "par").mkdir()
    for lang, word in (("en", "house"), ("es", "casa")):
        (root / "par" / f"{lang}.txt").write_text("".join(f"{word} {i}\n" for i in range(40)))
    (root / "text.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    return root


@pytest.fixture()
def no_model(monkeypatch) -> list[str]:
    """Every model loader of mechlingo replaced by one that fails the test."""
    from mechlingo.core import models

    calls: list[str] = []

    def boom(*args: Any, **kw: Any) -> Any:
        calls.append(str(args[:1]))
        raise AssertionError("--dry-run loaded the model")

    real = models.load_model
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("mechlingo") and (
            getattr(mod, "load_model", None) is real
        ):
            monkeypatch.setattr(mod, "load_model", boom)
    return calls


DRY = {
    "eval": ["eval", "--langs", "en,fr"],
    "lens": ["lens", "--langs", "en,fr"],
    "lens --prompt": ["lens", "--prompt", "The capital of France is"],
    "steer build": ["steer", "build", "--langs", "en,fr", "--relation", "capital"],
    "trace": ["trace", "--langs", "en,fr", "--patch-prompts", "2"],
    "steer eval": ["steer", "eval", "--langs", "en,fr", "--vectors", "{d}/vec"],
    "experts": ["experts", "--parallel", "{d}/par", "--target", "es", "--lines", "20",
                "--k", "5,10"],
    "align": ["align", "--parallel", "{d}/par", "--lines", "20"],
    "tuned-lens": ["tuned-lens", "--text-file", "{d}/text.txt", "--lines", "20",
                   "--heldout", "10"],
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(DRY))
def test_dry_run_never_loads_the_model(command, inputs, tiny_dir, no_model, tmp_path, capsys):
    out = tmp_path / "o"
    argv = [a.format(d=inputs) for a in DRY[command]]
    assert main([*argv, "--model", str(tiny_dir), "--out", str(out), "--dry-run"]) == 0
    assert no_model == []
    assert not out.exists() and not (tmp_path / ".o.work").exists()
    text = capsys.readouterr().out
    assert text.startswith(f"plan of mechlingo {command.split(' --')[0]}:")
    assert "estimated CPU time: " in text and "items: " in text


def _embedded_facts() -> list:
    return load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=10)


def test_lens_estimate_counts_a_pass_per_decoder_and_the_patchscope_layers():
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=3)
    logit = plans.plan_lens(facts, ["logit"], model=None)
    assert logit.estimate.counts == {"lens_read": 6.0, "lens_position": 0.0, "prompt": 0.0,
                                     "token": 0.0}  # fmt: skip
    assert logit.estimate.seconds == pytest.approx(6 * S["lens_read"])
    scope = plans.plan_lens(
        facts, ["logit", DecoderUse("patchscope", "patchscope", {"max_new_tokens": 2})], model=None
    )
    n_layers = costs.EMBEDDED_LAYERS
    assert scope.estimate.counts == {"lens_read": 12.0, "lens_position": 0.0,
                                     "prompt": 6.0 * n_layers, "token": 6.0 * n_layers * 2}  # fmt: skip
    assert scope.estimate.seconds == pytest.approx(
        12 * S["lens_read"] + 6 * n_layers * S["prompt"] + 12 * n_layers * S["token"]
    )
    # BOS + 5 words; BOS + 24 bytes / 8 (no spaces); the same per decoder
    texts = ["The capital of France is", "東京は日本の首都"]
    prompts = plans.plan_lens([], ["logit"], prompts=texts, model=None)
    assert prompts.estimate.counts["lens_position"] == 6.0 + 4.0 and "prompts: 2" in str(prompts)
    assert prompts.estimate.counts["lens_read"] == 0.0
    assert prompts.estimate.seconds == pytest.approx(10 * S["lens_position"])


def test_steer_build_estimate_counts_every_prompt_set_and_the_norm_pass():
    sets = {"few_shot": ["x"] * 5, "zero_shot": ["y"] * 6, "translation": ["z"] * 4}
    plan = plans.plan_steer_build(sets, model=None)
    assert plan.estimate.counts == {"prompt": 5.0 + 6 + 4 + 6}
    assert plan.estimate.seconds == pytest.approx(21 * S["prompt"])


def test_eval_estimate_is_the_hand_computation():
    facts = _embedded_facts()
    plan = plans.plan_eval(facts, "generate", 8, None)
    assert plan.estimate.counts == {"prompt": 30.0, "token": 240.0}
    assert plan.estimate.scale == 1.0
    assert plan.estimate.seconds == pytest.approx(30 * S["prompt"] + 240 * S["token"])
    assert "scaled" not in str(plan.estimate)


def test_trace_estimate_counts_every_patched_copy():
    facts = _embedded_facts()
    plan = plans.plan_trace(facts, max_new_tokens=8, patch_prompts=2, sites=["attn_out", "mlp_out"],
                            method="exact", model=None)  # fmt: skip
    # 3 languages x 2 prompts x 18 layers x 4 positions x 2 sites; knockout 6 x 18 passes
    assert plan.estimate.counts["patch_cell"] == 3 * 2 * 18 * 4 * 2
    assert plan.estimate.counts["prompt"] == 30 + 6 * 18
    want = 864 * S["patch_cell"] + 138 * S["prompt"] + 240 * S["token"]
    assert plan.estimate.seconds == pytest.approx(want)


def test_steer_eval_estimate_counts_the_protocol():
    from mechlingo.analyses.recall.settings import DevGrid

    facts = _embedded_facts()
    splits = {"dev": facts[:6], "test": facts[6:]}  # 6 dev, 24 test items
    grid = DevGrid(task_layers=(2, 4), diff_layers=(8,), task_alphas=(0.1, 0.2),
                   diff_alphas=(0.3,), top_k=1, screen_ids=1)  # fmt: skip
    plan = plans.plan_steer_eval(splits, grid=grid, seeds=2, repeats=1, max_new_tokens=6,
                                 transfer=None, model=None)  # fmt: skip
    langs = len({f.lang for f in facts[:6]})
    screen = min(6, langs)
    items = 2 * 6 + 5 * screen + (2 + 1 + 1) * 6 + 6 * 24
    assert plan.estimate.counts == {"prompt": items, "token": 6 * items}
    fixed = plans.plan_steer_eval(splits, grid=grid, seeds=2, repeats=2, max_new_tokens=6,
                                  transfer="relation", sweep=False, model=None)  # fmt: skip
    assert fixed.estimate.counts["prompt"] == 2 * (2 * 6 + 6 * 24)
    assert "transfer matrix (--transfer) is not in this estimate" in str(fixed.estimate)


def test_another_model_is_scaled_by_its_parameter_count_and_an_unknown_one_says_so(
    tiny_dir, tmp_path
):
    cfg = json.loads((Path(tiny_dir) / "config.json").read_text())
    ref = costs.model_shape(None)
    assert ref.params is not None and ref.n_layers == 18
    shape = costs.model_shape(str(tiny_dir))
    assert shape.params == costs.config_params(cfg)
    est = costs.estimate({"prompt": 100}, shape)
    assert est.scale == pytest.approx(shape.params / ref.params)
    assert est.seconds == pytest.approx(100 * S["prompt"] * shape.params / ref.params)
    assert "scaled x" in str(est)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    unknown = costs.estimate({"prompt": 100}, costs.model_shape(str(gguf)))
    assert unknown.seconds is None and "cannot know" in str(unknown)


def test_config_params_is_the_hand_count():
    cfg = {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16,
           "vocab_size": 10, "num_attention_heads": 2, "head_dim": 4,
           "num_key_value_heads": 1, "model_type": "gemma3_text"}  # fmt: skip
    attn = 2 * 8 * 2 * 4 + 2 * 8 * 1 * 4
    assert costs.config_params(cfg) == 2 * (attn + 3 * 8 * 16) + 10 * 8
    assert costs.config_params({"hidden_size": 8}) is None


def test_the_table_says_when_and_where_it_was_measured():
    assert set(S) == {"prompt", "token", "patch_cell", "sentence", "lens_step", "lens_read",
                      "lens_position"}  # fmt: skip
    assert all(v > 0 for v in S.values())
    assert {"date", "machine", "threads", "model"} <= set(costs.MEASURED_ON)
