"""The repair protocol: statistics against hand computations, the early verdict, the
natural templates, dev/test discipline (no test id reaches building or choosing), and the
whole protocol on the tiny model."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats as sps

import mechlingo.analyses.recall.dev_grid as dev_grid
import mechlingo.analyses.recall.steer_eval as protocol
import mechlingo.analyses.recall.steering as steering
from mechlingo.analyses.recall.dev_grid import LeakError, check_disjoint, lowest_language_dev
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    ScoringOptions,
    matrix_layers,
)
from mechlingo.core.answers import decided, is_correct
from mechlingo.core.errors import InputError
from mechlingo.core.sites import every_second_layer, layers_at
from mechlingo.data import LANGS, RELATIONS, load_facts, natural_templates
from mechlingo.kernels.significance import mcnemar, paired_gain, wilson
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts

# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------


def test_wilson_matches_the_formula():
    k, n, z = 7, 20, sps.norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    w = wilson(k, n)
    assert w.estimate == pytest.approx(0.35)
    assert w.lo == pytest.approx(centre - half, abs=1e-9)
    assert w.hi == pytest.approx(centre + half, abs=1e-9)
    assert wilson(0, 0).estimate is None and wilson(0, 10).lo == pytest.approx(0.0, abs=1e-12)


def test_mcnemar_is_an_exact_binomial_on_discordant_pairs():
    base = [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    new = [1, 1, 1, 1, 1, 0, 1, 0, 1, 0]
    m = mcnemar([bool(x) for x in base], [bool(x) for x in new])
    assert (m["fixed"], m["broken"], m["n"]) == (5, 1, 10)
    # two-sided exact: P(X <= 1) + P(X >= 5) for X ~ Bin(6, 1/2) = 2 * 7/64
    assert m["p"] == pytest.approx(14 / 64)
    assert mcnemar([True, False], [True, False])["p"] == 1.0
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_paired_gain_point_values_and_intervals():
    base = [0] * 30 + [1] * 10
    new = [1] * 20 + [0] * 10 + [1] * 10
    g = paired_gain(base, new)
    assert g.extra["base"] == pytest.approx(0.25) and g.extra["new"] == pytest.approx(0.75)
    assert g.estimate == pytest.approx(0.5)
    assert g.lo < 0.5 < g.hi and g.lo > 0.3
    rel = g.extra["relative"]
    assert rel.estimate == pytest.approx(2.0) and rel.lo < 2.0 < rel.hi
    zero = paired_gain([0, 0, 0], [1, 0, 0])
    assert zero.extra["relative"] is None and zero.estimate == pytest.approx(1 / 3)
    same = paired_gain([1, 0], [1, 0])
    assert same.lo == same.hi == 0.0


# --------------------------------------------------------------------------------------
# The early verdict equals the verdict on the full generation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("full", "answers", "lang", "english"),
    [
        (" Rome, the capital", ["Rome"], "fr", "Rome"),
        (" Romania is", ["Rome"], "fr", "Rome"),
        (" Roma è", ["Roma"], "it", "Rome"),
        (" Rome est", ["Roma"], "it", "Rome"),
        (" the city of Paris", ["Paris"], "en", ""),
        ("東京です", ["東京"], "ja", "Tokyo"),
        ("\nParis", ["Paris"], "fr", "Paris"),
        (" «Berlin»", ["Berlin"], "de", "Berlin"),
        (" Kaboul.", ["Kaboul", "Kabul"], "fr", "Kabul"),
    ],
)
def test_decided_prefixes_agree_with_the_full_verdict(full, answers, lang, english):
    final = is_correct(full, answers, lang)
    final_en = is_correct(full, [english], "en") if english else False
    for cut in range(len(full) + 1):
        part = full[:cut]
        if decided(part, answers, lang, english):
            assert is_correct(part, answers, lang) == final, (part, full)
            if not final and english:
                assert is_correct(part, [english], "en") == final_en, (part, full)


def test_early_stop_same_verdicts_on_tiny(tiny):
    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=6)
    a = evaluate_facts(tiny, facts, decoding=DecodeOptions(max_new_tokens=5, early_stop=True))
    b = evaluate_facts(tiny, facts, decoding=DecodeOptions(max_new_tokens=5, early_stop=False))
    for x, y in zip(a.records, b.records, strict=True):
        assert (x["correct"], x["in_english"]) == (y["correct"], y["in_english"])


@pytest.mark.slow
def test_early_stop_same_verdicts_on_gemma(gemma):
    facts = []
    for tpl in ("natural", "measured"):
        facts += load_facts(langs=LANGS, relations=["capital"], limit=4, templates=tpl)
    a = evaluate_facts(
        gemma, facts, decoding=DecodeOptions(max_new_tokens=6, batch_size=48, early_stop=True)
    )
    b = evaluate_facts(
        gemma, facts, decoding=DecodeOptions(max_new_tokens=6, batch_size=48, early_stop=False)
    )
    assert sum(r["correct"] for r in b.records) > 10  # the comparison means something
    for x, y in zip(a.records, b.records, strict=True):
        assert (x["correct"], x["in_english"]) == (y["correct"], y["in_english"]), x["prompt"]


# --------------------------------------------------------------------------------------
# Templates, layers, the lowest language
# --------------------------------------------------------------------------------------


def test_natural_templates_cover_every_relation_and_language():
    t = natural_templates()
    assert set(t) == set(RELATIONS)
    for rel in RELATIONS:
        assert set(t[rel]) == set(LANGS)
        assert all(s.count("{s}") == 1 and s == s.strip() for s in t[rel].values())
    tuned = load_facts(langs=["en", "ja"], relations=["capital"], limit=3)
    natural = load_facts(langs=["en", "ja"], relations=["capital"], limit=3, templates="natural")
    assert [f.id for f in tuned] == [f.id for f in natural]
    for f in natural:
        assert f.prompt == t["capital"][f.lang].replace("{s}", f.subject)
        assert f.prompt[f.subject_span[0] : f.subject_span[1]] == f.subject
    assert natural[0].prompt == "The capital of Afghanistan is" != tuned[0].prompt


def test_every_second_layer_from_20_to_90_percent():
    assert every_second_layer(18) == [4, 6, 8, 10, 12, 14, 16]
    assert every_second_layer(2) == [0]
    assert every_second_layer(32) == [6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28]


def test_layers_at_fractions_by_hand():
    # round(f * n) clamped to the model, sorted, each once
    assert layers_at([0.5, 0.67], 18) == [9, 12]
    assert layers_at([0.33, 0.5, 0.67, 0.83], 18) == [6, 9, 12, 15]
    assert layers_at([0.0, 0.99, 1.5, -0.2], 18) == [0, 17]
    assert layers_at([0.5, 0.52], 18) == [9]
    assert matrix_layers(18) == [6, 10, 14] and matrix_layers(2) == [1]


def test_lowest_language_is_fixed_on_dev_and_never_english():
    zero = {lg: wilson(k, 10).to_json() for lg, k in {"en": 0, "fr": 0, "ja": 0, "de": 3}.items()}
    few = {lg: wilson(k, 10).to_json() for lg, k in {"en": 9, "fr": 6, "ja": 2, "de": 7}.items()}
    assert lowest_language_dev(zero, few) == "ja"  # tie at 0 broken by few-shot
    assert lowest_language_dev({"en": wilson(0, 4).to_json()}, {}) is None


def test_check_disjoint_names_the_stage():
    facts = load_facts(langs=["en"], relations=["capital"], limit=3)
    check_disjoint("x", facts[:1], facts[1:])
    with pytest.raises(LeakError, match="building"):
        check_disjoint("building", [facts[0].id], facts)


# --------------------------------------------------------------------------------------
# The protocol end to end on the tiny model, watched for leaks
# --------------------------------------------------------------------------------------


def test_no_test_id_reaches_building_or_choosing(tiny_dir, tmp_path, monkeypatch):
    from mechlingo.cli import main

    seen: dict[str, set[str]] = {"build": set(), "choose": set(), "test": set()}
    real_build, real_sweep = steering.build_steering_vectors, dev_grid.choose_on_dev
    real_test, real_few = protocol.evaluate_test, dev_grid.few_shot_prompt

    def build(model, facts, *a, pool=None, **kw):
        seen["build"] |= {f.id for f in facts} | {f.id for f in (pool or [])}
        return real_build(model, facts, *a, pool=pool, **kw)

    def sweep(model, vectors, dev, *a, **kw):
        seen["choose"] |= {f.id for f in dev} | {f.id for f in kw.get("pool") or []}
        return real_sweep(model, vectors, dev, *a, **kw)

    def few(fact, pool, *a, **kw):
        seen["build"] |= {f.id for f in pool}
        return real_few(fact, pool, *a, **kw)

    def test(model, vectors, choice, test_facts, *a, **kw):
        seen["test"] |= {f.id for f in test_facts}
        return real_test(model, vectors, choice, test_facts, *a, **kw)

    monkeypatch.setattr(steering, "build_steering_vectors", build)
    monkeypatch.setattr(dev_grid, "choose_on_dev", sweep)
    monkeypatch.setattr(protocol, "evaluate_test", test)
    monkeypatch.setattr(dev_grid, "few_shot_prompt", few)
    common = ["--model", str(tiny_dir), "--langs", "en,fr,de", "--limit", "30", "--quiet",
              "--templates", "natural"]  # fmt: skip
    vdir, out = tmp_path / "v", tmp_path / "e"
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(vdir)]) == 0
    grid = [
        "--task-layers",
        "0",
        "--diff-layers",
        "1",
        "--task-alphas",
        "0.1,0.5",
        "--diff-alphas",
        "0.5",
        "--top-k",
        "1",
        "--screen-ids",
        "2",
    ]
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--vectors",
            str(vdir),
            *grid,
            "--max-new-tokens",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert seen["test"] and seen["build"] and seen["choose"]
    assert not (seen["test"] & seen["build"]), "a test id reached building"
    s = json.loads((out / "summary.json").read_text())
    assert s["dev_effect"] in ("found", "none found")
    assert s["sweep"]["n_screen_items"] < s["sweep"]["n_dev_items"]
    assert {r["stage"] for r in s["sweep"]["rows"]} == {"screen", "dev"}
    # headroom rule: a language without headroom is excluded; no language left -> None
    assert s["lowest_language"] in ("fr", "de", None)
    assert s["lowest_language"] not in s["lowest_language_excluded"]
    assert (s["lowest_language"] is None) == (sorted(s["lowest_language_excluded"]) == ["de", "fr"])
    assert s["lowest_language_literal"] in ("en", "fr", "de")
    assert set(s["headline"]) >= {"headroom_rule", "literal_rule", "both_condition"}
    assert set(s["headroom"]["k_shot"]) == {"en", "fr", "de"}
    assert s["mcnemar_vs_random"]["both"].keys() == {"random_s0", "random_s1", "random_s2"}
    # side effects of the selected condition, against a random control, on NTREX-style lines
    lines = tmp_path / "lines"
    lines.mkdir()
    for lg, text in {
        "en": "The cat sat on the mat",
        "fr": "Le chat est sur le tapis",
        "de": "Die Katze sitzt auf der Matte",
    }.items():
        (lines / f"{lg}.txt").write_text(f"{text}\n{text} again\n", "utf-8")
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--vectors",
            str(vdir),
            "--config",
            "0,0.1,1,0.1",
            "--max-new-tokens",
            "2",
            "--side-effects",
            "--parallel",
            str(lines),
            "--side-effects-lines",
            "2",
            "--out",
            str(tmp_path / "se"),
        ]
    )
    s = json.loads((tmp_path / "se" / "summary.json").read_text())
    assert rc == 0 and "side_effects" in s
    # re-splits: vectors rebuilt per salt, mean and sd over splits
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--vectors",
            str(vdir),
            "--config",
            "0,0.1,1,0.1",
            "--max-new-tokens",
            "2",
            "--repeats",
            "2",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert rc == 0 and s["repeats"]["n"] == 2
    assert len(s["repeats"]["non_english_mean"]["orig"]["values"]) == 2
    # a vector folder whose build ids overlap the test split is refused
    build_json = vdir / "build.json"
    doc = json.loads(build_json.read_text())
    doc["fact_ids"] = sorted(seen["test"])
    build_json.write_text(json.dumps(doc))
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--vectors",
            str(vdir),
            "--config",
            "0,0.1,1,0.1",
            "--max-new-tokens",
            "2",
            "--out",
            str(tmp_path / "leak"),
        ]
    )
    assert rc == 2 and not (tmp_path / "leak").exists()


def test_steer_eval_cli_writes_what_run_protocol_writes(tiny, tiny_dir, tmp_path):
    """`mechlingo steer eval` and `protocol.run_steer_eval(...).write(out)` with the same
    settings (a dev search, two seeds, a re-split) write the same summary.json (but its
    meta) and generations.jsonl."""
    from mechlingo.analyses.recall.steering import SteeringPair
    from mechlingo.cli import main

    common = ["--model", str(tiny_dir), "--langs", "en,fr,de", "--limit", "30", "--quiet",
              "--templates", "natural"]  # fmt: skip
    vdir, cli, py = tmp_path / "v", tmp_path / "cli", tmp_path / "py"
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(vdir)]) == 0
    grid = [
        "--task-layers",
        "0",
        "--diff-layers",
        "1",
        "--task-alphas",
        "0.1,0.5",
        "--diff-alphas",
        "0.5",
        "--top-k",
        "1",
        "--screen-ids",
        "2",
    ]
    assert (
        main(
            [
                "steer",
                "eval",
                *common,
                "--vectors",
                str(vdir),
                *grid,
                "--control-seeds",
                "0,1",
                "--repeats",
                "2",
                "--max-new-tokens",
                "2",
                "--out",
                str(cli),
            ]
        )
        == 0
    )
    facts = load_facts(
        langs=["en", "fr", "de"], relations=["capital"], limit=30, templates="natural"
    )
    grid = DevGrid(
        task_layers=(0,),
        diff_layers=(1,),
        task_alphas=(0.1, 0.5),
        diff_alphas=(0.5,),
        top_k=1,
        screen_ids=2,
    )
    res = protocol.run_steer_eval(
        tiny,
        facts,
        SteeringPair.load(vdir, tiny),
        protocol.SteerEvalOptions(
            grid=grid,
            seeds=(0, 1),
            repeats=2,
            scoring=ScoringOptions(max_new_tokens=2, batch_size=16),
        ),
    )  # fmt: skip  (batch_size: the CLI's --batch-size)
    res.write(py)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (cli, py))
    assert "meta" in a and "meta" not in b
    a.pop("meta")
    assert a == b and a["repeats"]["n"] == 2 and a["sweep"]["rows"]
    gen = [(d / "generations.jsonl").read_text() for d in (cli, py)]
    assert gen[0] == gen[1] and gen[0].count("\n") > 10
    assert {"format_version": 1, **res.summary()} == b and res.search is not None


def test_repeats_rebuild_with_the_given_vectors_build_settings(tiny, monkeypatch):
    """A re-split (``repeats`` > 1) rebuilds its vectors with the settings the given vectors
    were built with (here k_shot=2 and one translation shot), not the library defaults."""
    from mechlingo.data.splits import split_facts

    facts = load_facts(
        langs=["en", "fr", "de"], relations=["capital"], limit=30, templates="natural"
    )
    build = split_facts(facts, (0.4, 0.2, 0.4))["build"]
    given = steering.build_steering_vectors(
        tiny, build, BuildSettings(k_shot=2, translation_shots=1)
    )
    seen = []
    real = steering.build_steering_vectors

    def spy(model, facts, settings, **kwargs):
        seen.append(settings)
        return real(model, facts, settings, **kwargs)

    monkeypatch.setattr(steering, "build_steering_vectors", spy)
    config = steering.SteeringConfig(0, 0.1, 1, 0.1)
    res = protocol.run_steer_eval(
        tiny,
        facts,
        given,
        protocol.SteerEvalOptions(repeats=2, config=config, seeds=(0,),
                         scoring=ScoringOptions(max_new_tokens=2)),
    )  # fmt: skip
    assert len(seen) == 1  # the first split uses the given vectors, the re-split rebuilds
    rebuilt = seen[0]
    assert rebuilt.k_shot == 2 and rebuilt.translation_shots == 1
    assert rebuilt.unit == given.build["unit"]
    assert res.summary()["repeats"]["n"] == 2


def test_build_settings_default_and_the_recorded_ones():
    # one default for the CLI, the library, the transfer matrix and a re-split's rebuild
    assert BuildSettings().translation_shots == 2 and BuildSettings().k_shot == 3
    assert BuildSettings.of({}) == BuildSettings()  # vectors that record nothing
    got = BuildSettings.of({"k_shot": 2, "translation_shots": 0, "unit": "raw"})
    assert (got.k_shot, got.translation_shots, got.unit) == (2, 0, "raw")


def test_a_random_population_per_condition():
    """With ``controls="each"`` task, diff and both each get their own population; the one
    that ``random_s`` already is (matched to the selected condition at the chosen config) is
    not scored twice, and a dev-chosen pair gives 'both' its own population at the pair."""
    from mechlingo.analyses.recall.steer_eval import SteerEvalOptions, population_names

    assert population_names("both", False, "each") == {
        "task": "random_task_s", "diff": "random_diff_s", "both": "random_s"}  # fmt: skip
    assert population_names("task", False, "each")["task"] == "random_s"
    assert population_names("both", True, "each")["both"] == "random_both_s"
    assert population_names("diff", True, "selected") == {"diff": "random_s"}
    with pytest.raises(InputError, match="controls"):
        SteerEvalOptions(controls="all")
    assert not hasattr(protocol, "RandomControls")  # the options hold seeds and controls
    each = SteerEvalOptions(seeds=(0, 1), controls="each")
    assert (each.seeds, each.controls) == ((0, 1), "each")
