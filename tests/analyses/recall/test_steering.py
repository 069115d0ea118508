"""Repair vectors: splits, streaming means, building, sweep/eval plumbing and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from mechlingo.activations.runs import collect, last_token_means
from mechlingo.analyses.recall.settings import BuildSettings, DevGrid, ScoringOptions
from mechlingo.analyses.recall.steering import (
    SteeringConfig,
    SteeringPair,
    build_steering_vectors,
    conditions,
    lowest_above_zero,
    relative_gain,
    score_at_config,
    vectors_from_means,
)
from mechlingo.core.errors import ArtifactError
from mechlingo.core.tokens import encode
from mechlingo.data import load_facts
from mechlingo.data.splits import split_facts, take_per_lang
from mechlingo.interventions import SteeringVector
from mechlingo.scoring.evaluate import DecodeOptions, greedy_generate
from tests.conftest import count_hooks


def test_split_is_disjoint_deterministic_and_aligned():
    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital", "currency"], limit=40)
    a = split_facts(facts)
    b = split_facts(list(reversed(facts)))
    ids = {s: {f.id for f in fs} for s, fs in a.items()}
    assert ids == {s: {f.id for f in fs} for s, fs in b.items()}
    assert not (ids["build"] & ids["dev"] or ids["build"] & ids["test"] or ids["dev"] & ids["test"])
    assert all(ids.values()) and sum(len(fs) for fs in a.values()) == len(facts)
    for s in a:  # the same fact is in the same split in every language
        langs_per_id: dict[str, set] = {}
        for f in a[s]:
            langs_per_id.setdefault(f.id, set()).add(f.lang)
        assert all(v == {"en", "fr", "ja"} for v in langs_per_id.values())
    few = take_per_lang(a["test"], 3)
    assert len({f.id for f in few}) <= 6 and len(few) == 3 * len({f.id for f in few})


def test_streaming_means_match_direct_mean(tiny):
    prompts = ["The capital of Italy is", "Rome", "La capitale", "Die Hauptstadt von Italien ist"]
    got = last_token_means(tiny, prompts, batch_size=3)
    assert got.mean.dtype == torch.float64 and got.mean.shape == (2, tiny.cfg.d_model)
    rows = []
    for p in prompts:  # one prompt at a time, no padding
        acts = collect(tiny, encode(tiny, [p]), [f"blocks.{i}.hook_resid_pre" for i in (0, 1)])
        rows.append(torch.stack([acts[f"blocks.{i}.hook_resid_pre"][0] for i in (0, 1)]))
    torch.testing.assert_close(got.mean.float(), torch.stack(rows).mean(0), rtol=1e-5, atol=1e-5)
    assert got.count == 4 and count_hooks(tiny) == 0


@pytest.fixture(scope="module")
def tiny_facts():
    return load_facts(langs=["en", "fr"], relations=["capital"], limit=24)


@pytest.fixture(scope="module")
def tiny_vectors(tiny, tiny_facts):
    return build_steering_vectors(
        tiny, split_facts(tiny_facts)["build"], BuildSettings(k_shot=2, translation_shots=0)
    )


def test_build_vectors_on_tiny(tiny, tiny_vectors):
    v = tiny_vectors
    assert v.task.vector.shape == v.diff.vector.shape == (2, tiny.cfg.d_model)
    assert torch.isfinite(v.task.vector).all() and torch.isfinite(v.diff.vector).all()
    assert v.unit == "resid" and v.build["subtract_zero_shot"] is True
    # default: difference vectors, each row scaled to the mean residual norm at its layer
    few, zero, trans = (v.means[k] for k in ("few_shot", "zero_shot", "translation"))
    resid = torch.tensor(v.build["resid_norm"])
    cos = torch.nn.functional.cosine_similarity
    # at layer 0 few-shot and zero-shot prompts end in the same token: the difference is 0
    # and stays 0 (a zero row is not blown up to the residual norm)
    assert torch.equal(v.task.vector[0], torch.zeros(tiny.cfg.d_model))
    assert cos(v.task.vector[1], (few - zero)[1], dim=-1) > 1 - 1e-4
    assert torch.allclose(cos(v.diff.vector, trans - zero, dim=-1), torch.ones(2), atol=1e-4)
    torch.testing.assert_close(v.task.vector[1].norm(), resid[1], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(v.diff.vector.norm(dim=-1), resid, rtol=1e-3, atol=1e-3)
    assert v.build["langs"] == ["en", "fr"] and v.build["n_prompts"]["translation"] > 0
    assert v.task.meta["model"]["d_model"] == tiny.cfg.d_model
    # the mean residual norm is a mean of per-prompt norms (>= the norm of the mean)
    assert (resid >= zero.norm(dim=-1) - 1e-3).all()
    # the plain, raw variant is the few-shot mean itself
    raw = vectors_from_means(v.means, None, subtract_zero_shot=False, unit="raw")
    torch.testing.assert_close(raw.task.vector, few)
    torch.testing.assert_close(raw.diff.vector, trans - zero)
    assert raw.unit == "raw" and raw.build["raw_norms"]["task"][0] > 0
    with pytest.raises(ValueError, match="resid_norm"):
        vectors_from_means(v.means, None, unit="resid")


def test_vectors_save_load_and_conditions(tiny, tiny_vectors, tmp_path):
    tiny_vectors.save(tmp_path / "v", tiny)
    back = SteeringPair.load(tmp_path / "v", tiny)
    assert torch.equal(back.task.vector, tiny_vectors.task.vector)
    assert back.build["k_shot"] == 2
    conds = conditions(back, SteeringConfig(1, 1.0, 0, 2.0))
    assert conds["orig"] is None
    rnd = conds["random"].parts
    assert isinstance(rnd[0], SteeringVector) and rnd[0].layer == 1 and rnd[1].alpha == 2.0
    torch.testing.assert_close(rnd[0].direction().norm(), back.task.vector[1].norm())
    torch.testing.assert_close(rnd[1].direction().norm(), back.diff.vector[0].norm())
    assert not torch.allclose(rnd[0].direction(), back.task.vector[1])


def test_vectors_without_a_unit_are_refused(tiny, tiny_dir, tiny_vectors, tmp_path, capsys):
    """A build.json with no ``unit`` (written before units existed) is an ArtifactError that
    says to rebuild; an explicit ``"raw"`` unit loads."""
    folder = tiny_vectors.save(tmp_path / "v", tiny)
    doc = json.loads((folder / "build.json").read_text())
    (folder / "build.json").write_text(json.dumps({**doc, "unit": "raw"}))
    assert SteeringPair.load(folder, tiny).unit == "raw"
    del doc["unit"]
    (folder / "build.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="no unit") as err:
        SteeringPair.load(folder, tiny)
    assert "steer build" in str(err.value.fix) and err.value.where.endswith("build.json")
    with pytest.raises(ArtifactError, match="no unit"):
        _ = SteeringPair(tiny_vectors.task, tiny_vectors.diff, {}, {}).unit
    from mechlingo.cli import main

    out = tmp_path / "e"
    rc = main(
        [
            "steer",
            "eval",
            "--model",
            str(tiny_dir),
            "--vectors",
            str(folder),
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and not out.exists()
    assert "records no unit" in capsys.readouterr().err


def test_sweep_and_evaluate_plumbing(tiny, tiny_facts, tiny_vectors):
    from mechlingo.analyses.recall.dev_grid import choose_on_dev

    dev = take_per_lang(split_facts(tiny_facts)["dev"], 2)
    res = choose_on_dev(
        tiny,
        tiny_vectors,
        dev,
        grid=DevGrid(
            task_layers=(0,),
            task_alphas=(0.5, 1.0),
            diff_layers=(1,),
            diff_alphas=(1.0,),
            top_k=1,
            screen_ids=None,
        ),
        scoring=ScoringOptions(max_new_tokens=2),
    )
    assert [(r["stage"], r["vector"]) for r in res.rows] == [
        ("screen", "task"),
        ("screen", "task"),
        ("screen", "diff"),
        ("dev", "task"),
        ("dev", "diff"),
        ("dev", "both"),
    ]
    assert res.best.task_layer == 0 and res.best.diff_layer == 1
    assert res.fig_heatmap("task").data
    out = score_at_config(tiny, tiny_vectors, res.best, dev, max_new_tokens=2)
    s = out.summary()
    assert set(s["accuracy"]) == {"orig", "task", "diff", "both", "random"}
    assert set(s["accuracy"]["orig"]) == {"en", "fr"}
    assert s["lowest_language"] in ("en", "fr", None)
    assert s["alpha_unit"] == "resid" and set(s["absolute_gain"]["both"]) == {"en", "fr"}
    assert s["absolute_gain"]["orig"] == {"en": 0.0, "fr": 0.0}
    assert set(s["english_effect"]) == set(s["accuracy"])
    assert count_hooks(tiny) == 0


def test_relative_gain():
    assert relative_gain(0.45, 0.3) == pytest.approx(0.5)
    assert relative_gain(0.0, 0.0) == 0.0 and relative_gain(0.1, 0.0) == float("inf")
    # the lowest language is the lowest one above 0 (a gain over 0 is undefined)
    assert lowest_above_zero({"en": 0.8, "hi": 0.0, "ja": 0.2, "ko": 0.2}) == "ja"
    assert lowest_above_zero({"en": 0.0, "hi": 0.0}) is None


def test_cli_build_and_eval_on_tiny(tiny_dir, tmp_path):
    from mechlingo.cli import main

    vdir, out = tmp_path / "vec", tmp_path / "eval"
    common = [
        "--model",
        str(tiny_dir),
        "--langs",
        "en,fr",
        "--relation",
        "capital",
        "--limit",
        "24",
        "--quiet",
    ]
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(vdir)]) == 0
    assert (vdir / "task" / "intervention.safetensors").is_file()
    assert (
        main(
            [
                "steer",
                "eval",
                *common,
                "--vectors",
                str(vdir),
                "--out",
                str(out),
                "--config",
                "0,1,1,1",
                "--test-per-lang",
                "2",
                "--max-new-tokens",
                "2",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    conds = {"orig", "task", "diff", "both", "random_s0", "random_s1", "random_s2", "random"}
    assert set(summary["accuracy"]) == conds
    # the headroom rule: fr (the only non-English language) has no headroom on the tiny
    # model (3-shot no better than zero-shot), so no lowest language; the literal rule
    # still names one
    assert summary["lowest_language"] is None and summary["lowest_language_excluded"] == ["fr"]
    assert summary["lowest_language_literal"] in ("en", "fr")
    assert summary["headline"]["headroom_rule"]["language"] is None
    assert summary["alpha_unit"] == "resid" and summary["dev_effect"].startswith("not measured")
    assert set(summary["intervals"]["orig"]) == {"en", "fr"}
    assert summary["meta"]["templates"] == "measured"  # the default of every command
    assert (out / "report.html").stat().st_size > 1000
    # a vector folder that does not exist is a usage error (exit 2), nothing written
    assert (
        main(
            [
                "steer",
                "eval",
                *common,
                "--vectors",
                str(tmp_path / "nope"),
                "--out",
                str(tmp_path / "x"),
                "--config",
                "0,1,1,1",
            ]
        )
        == 2
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_gemma_vectors_change_generations(gemma):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=4)
    vectors = build_steering_vectors(
        gemma, facts, BuildSettings(k_shot=2, translation_shots=0, batch_size=8)
    )
    for stack in (vectors.task.vector, vectors.diff.vector):
        assert stack.shape == (18, 640) and torch.isfinite(stack).all()
    prompts = [f.prompt for f in facts if f.lang != "en"][:3]
    both = conditions(vectors, SteeringConfig(6, 1.0, 12, 2.0))["both"]
    plain = greedy_generate(gemma, prompts, decoding=DecodeOptions(max_new_tokens=4))
    steered = greedy_generate(
        gemma, prompts, intervention=both, decoding=DecodeOptions(max_new_tokens=4)
    )
    assert plain != steered
    assert count_hooks(gemma) == 0


def test_padded_batched_generation_equals_one_by_one(tiny):
    prompts = ["The capital of Italy is", "Rome", "La capitale de la France est", "Die", "A b"]
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(5))
    for iv in (None, SteeringVector(v, 1, 3.0), SteeringVector(v, 0, 2.0, positions="all")):
        got = greedy_generate(
            tiny, prompts, intervention=iv, decoding=DecodeOptions(max_new_tokens=4, batch_size=8)
        )
        ref = [
            greedy_generate(tiny, [p], intervention=iv, decoding=DecodeOptions(max_new_tokens=4))[0]
            for p in prompts
        ]
        assert got == ref
    assert count_hooks(tiny) == 0


def test_steer_eval_layer_out_of_range_is_a_usage_error(tiny_dir, tmp_path, capsys):
    from mechlingo.cli import main

    common = [
        "--model",
        str(tiny_dir),
        "--langs",
        "en,fr",
        "--relation",
        "capital",
        "--limit",
        "24",
        "--quiet",
    ]
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(tmp_path / "v")]) == 0
    out = tmp_path / "eval"
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--vectors",
            str(tmp_path / "v"),
            "--config",
            "7,0.1,1,0.1",
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "out of range" in capsys.readouterr().err
    assert not out.exists()
