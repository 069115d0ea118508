"""A new decoder with one option is one module: this one. The blended lens (each entry's
residual moved toward the last entry's by ``--blend``, then the logit lens) is defined and
registered here, with one option and a cost of its own, and then run through everything that
takes ``--decoder``: ``lens`` (with the logit lens beside it), ``lens --prompt``, the dry-run
estimate and the card's decoders stage (with its default there: the card's budget has settings only
for the shipped decoders' options), each checked against values computed here. A scan of
the package checks that no module names a registered decoder but its own.

(A scaled residual would be no test: the final norm undoes a scale, so a "scaled logit lens"
reads exactly as the logit lens.)"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

from mechlingo.analyses.decoders import registry
from mechlingo.analyses.decoders.lens import lens_facts
from mechlingo.analyses.decoders.registry import DecoderOption, register_decoder
from mechlingo.analyses.decoders.tuned_lens import NO_TUNED_LENS
from mechlingo.card.stages import decoders as card_decoders
from mechlingo.cli import cost
from mechlingo.cli.decoders import decoder_choice
from mechlingo.cli.main import build_parser, main
from mechlingo.core.errors import InputError
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import encode
from mechlingo.data import load_facts
from mechlingo.data.splits import take_shared
from mechlingo.viz import palette

#: The blended lens's default weight of the last entry.
BLEND = 0.5
#: Its declared forward passes of its own per prompt and entry (a made-up cost to find in
#: the estimate).
PASSES = 2.0
#: Its declared cost to the card per prompt.
CARD_COST = 3.0


@dataclass(frozen=True)
class Blended:
    """``(1 - blend) * x_e + blend * x_last`` at every entry ``e``, then the logit lens: at
    ``blend = 1`` every entry reads as the last one, at 0 as the logit lens."""

    blend: float
    name: str = "blended"

    def check(self, model) -> None:
        site_map(model)

    def decode(self, model, entries, acts, langs):
        return (1 - self.blend) * acts + self.blend * acts[-1:]


def _blended(model, *, blend: float = BLEND, **opts) -> Blended:
    return Blended(blend)


@pytest.fixture
def blended():
    """The decoder registered for one test, and removed after it (with its colour)."""
    colors = dict(palette.DECODER)
    spec = register_decoder(
        "blended", _blended, help="each entry moved toward the last one (--blend)",
        layer_passes=PASSES, card_cost=CARD_COST,
        options=[DecoderOption("--blend", "blend", float, BLEND,
                               "weight of the last entry's residual", minimum=0, maximum=1)],
    )  # fmt: skip
    yield spec
    registry.unregister_decoder("blended")
    palette.DECODER.clear()
    palette.DECODER.update(colors)


def _hand(model, prompt: str, blend: float) -> torch.Tensor:
    """``[entry, vocab]`` log-probabilities at the prompt's last token: each entry's residual
    blended with the output entry's, the final norm, ``W_U`` and ``b_U``, from a plain cache."""
    tokens = encode(model, [prompt]).tokens
    _, cache = model.run_with_cache(tokens)
    n = model.cfg.n_layers
    names = [f"blocks.{e}.hook_resid_pre" for e in range(n)] + [f"blocks.{n - 1}.hook_resid_post"]
    x = torch.stack([cache[nm][0, -1] for nm in names])
    x = (1 - blend) * x + blend * x[-1:]
    logits = model.ln_final(x.unsqueeze(0)).squeeze(0) @ model.W_U + model.b_U
    return torch.log_softmax(logits.float(), -1)


def test_the_api_builds_it_with_its_option(tiny, blended):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=2)
    for given, blend in (({}, BLEND), ({"blend": 0.25}, 0.25)):
        res = lens_facts(tiny, facts, decoder="blended", decoder_options=given, top_k=3)
        assert res.decoder == "blended"
        for p, f in enumerate(facts):
            top = _hand(tiny, f.prompt, blend).topk(3, dim=-1)
            torch.testing.assert_close(res.top_logprobs[:, p], top.values, atol=1e-4, rtol=1e-4)
    logit = lens_facts(tiny, facts, top_k=3)
    assert not torch.allclose(res.top_logprobs[:-1], logit.top_logprobs[:-1], atol=1e-3)
    torch.testing.assert_close(res.top_logprobs[-1], logit.top_logprobs[-1])  # the output entry
    with pytest.raises(InputError, match="--blend must be at most 1"):
        registry.get_decoder("blended", tiny, blend=2.0)


def _lens_args(tiny_dir: Path, *more: str) -> list[str]:
    return ["lens", "--model", str(tiny_dir), "--langs", "en,fr", "--relation", "capital",
            "--limit", "2", "--quiet", *more]  # fmt: skip


def test_the_lens_command_runs_it_beside_the_logit_lens(tiny_dir, tmp_path, blended, capsys):
    # the parser has its flag, with its help and default
    lens = build_parser()._subparsers._group_actions[0].choices["lens"]  # type: ignore[union-attr]
    flag = next(a for a in lens._actions if "--blend" in a.option_strings)
    assert flag.default == BLEND and "weight of the last entry" in (flag.help or "")
    assert f"default {BLEND}" in (flag.help or "")

    out = tmp_path / "lens"
    assert main(_lens_args(tiny_dir, "--decoder", "logit,blended", "--blend", "1",
                           "--out", str(out))) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert list(summary["decoders"]) == ["logit", "blended"]
    df = pd.read_csv(out / "lens.csv")
    last = df["layer"].max()
    lp = df.pivot_table(index=["decoder", "prompt", "track"], columns="layer", values="logprob")
    # --blend 1 reached it: every entry reads as the output entry, which the logit lens
    # reads the same; the logit lens's earlier entries differ
    blend, logit = lp.loc["blended"], lp.loc["logit"]
    for layer in lp.columns:
        assert blend[layer].to_numpy() == pytest.approx(logit[last].to_numpy(), abs=1e-4)
    assert not logit[0].to_numpy() == pytest.approx(logit[last].to_numpy(), abs=1e-3)

    # bad values and a stray flag are refused before the model loads
    capsys.readouterr()
    assert main(_lens_args(tiny_dir, "--decoder", "blended", "--blend", "2",
                           "--out", str(tmp_path / "bad"))) == 2  # fmt: skip
    assert "--blend must be at most 1" in capsys.readouterr().err
    assert main(_lens_args(tiny_dir, "--blend", "0.3", "--out", str(tmp_path / "bad"))) == 2
    assert "--blend is an option of --decoder blended" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_lens_prompt_runs_it_as_itself(tiny_dir, tmp_path, blended):
    def grid(*more: str) -> list:
        out = tmp_path / "-".join(more or ("logit",))
        assert main(["lens", "--model", str(tiny_dir), "--prompt", "The capital of France is",
                     "--quiet", "--out", str(out), *more]) == 0  # fmt: skip
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["meta"]["decoder"] == (more[1] if more else "logit")
        doc = json.loads((out / "tokens.json").read_text(encoding="utf-8"))
        # per entry: the top tokens' probabilities at every position, flat
        return [[c["prob"] for cell in row for c in cell] for row in doc[0]["top"]]

    blended_probs = grid("--decoder", "blended", "--blend", "1")
    logit_probs = grid()
    # every entry at every position reads as the last entry (the logit lens's last entry)
    for row in blended_probs:
        assert row == pytest.approx(logit_probs[-1], abs=1e-5)
    assert logit_probs[0] != pytest.approx(logit_probs[-1], abs=1e-3)  # not the logit lens


def test_the_estimate_uses_its_declared_cost(tiny, tiny_dir, tmp_path, blended, capsys):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=2)
    out = str(tmp_path / "plan")
    args = build_parser().parse_args(
        _lens_args(tiny_dir, "--decoder", "logit,blended", "--out", out)
    )
    uses = decoder_choice(args).uses
    assert [(u.label, dict(u.options)) for u in uses] == [("logit", {}),
                                                          ("blended", {"blend": BLEND})]  # fmt: skip
    plan = cost.plan_lens(facts, uses, model=str(tiny_dir))
    n_layers = int(tiny.cfg.n_layers)
    assert plan.estimate.counts == {"lens_read": 2.0 * len(facts), "lens_position": 0.0,
                                    "prompt": len(facts) * n_layers * PASSES, "token": 0.0}  # fmt: skip
    assert main(_lens_args(tiny_dir, "--decoder", "blended", "--dry-run", "--out", out)) == 0
    assert (
        f"blended: {PASSES:g} pass(es) of its own per layer ({n_layers})" in capsys.readouterr().out
    )


def test_the_card_stage_reads_it(tiny, blended):
    facts = load_facts(langs=["en", "fr", "de"], relations=["capital"], limit=3)
    section = {"per_lang": 2, "tuned_lens": None}
    budget = card_decoders.DecodersBudget.from_mapping(section, "decoders")
    cfg = {"decoders": budget.to_dict(), "trace": {"max_rank": 10}, "lu_langs": ["en", "fr", "de"]}
    out = card_decoders.stage_decoders(tiny, facts, None, cfg, progress=False)
    assert list(out["decoders"]) == ["logit", "tuned", "patchscope", "blended"]
    assert out["decoders"]["tuned"] == {"untestable": NO_TUNED_LENS}

    # the same order computed here from the blended lens at its default
    sub = take_shared([f for f in facts if f.lang != "en"], 2)
    sub = [f for lg in dict.fromkeys(f.lang for f in sub) for f in sub if f.lang == lg]
    res = lens_facts(tiny, sub, decoder=Blended(BLEND))
    want = card_decoders._order(res.first_layer_within("en", 10, before_last=True),
                                res.first_layer_within("answer", 10), sub)  # fmt: skip
    assert out["decoders"]["blended"] == {"items": want, "n_prompts": len(sub)}
    plain = lens_facts(tiny, sub)  # the logit lens reads other ranks at the middle entries
    assert not torch.equal(res.rank[1:-1], plain.rank[1:-1])
    # no claim names it: the table only, the rows are the shipped claims'
    ids = [r["id"] for r in card_decoders.rows_decoders(out)]
    assert ids == ["latent_english_tuned", "latent_english_patchscope"]
    # its declared card cost is added to the stage's estimate
    sizes, unit = {"lu_langs": 3}, {"rank": 1.0}
    with_it = card_decoders.cost(cfg, sizes, unit)
    registry.unregister_decoder("blended")
    assert with_it - card_decoders.cost(cfg, sizes, unit) == pytest.approx(CARD_COST * 2 * 2)


def test_every_command_with_decoder_is_covered_here():
    """The commands that take --decoder are those this module runs (a new one must be
    added here)."""
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    taking = {name for name, p in sub.items()
              if any("--decoder" in a.option_strings for a in p._actions)}  # fmt: skip
    assert taking == {"lens"}


def test_after_unregistering_it_is_unknown(tiny_dir, tmp_path, capsys):
    assert "blended" not in registry.decoder_names()
    lens = build_parser()._subparsers._group_actions[0].choices["lens"]  # type: ignore[union-attr]
    assert not any("--blend" in a.option_strings for a in lens._actions)
    assert main(_lens_args(tiny_dir, "--decoder", "blended", "--out", str(tmp_path / "x"))) == 2
    assert "choose distinct names from logit, tuned, patchscope" in capsys.readouterr().err


#: Modules that name a shipped decoder without registering it, and why.
NAMED_ELSEWHERE = {
    # the card's claims are about the shipped decoders (claim ids latent_english_NAME)
    "mechlingo.card.claims",
    # the figure tier sits below the registry: the shipped decoders' colours, and the
    # token grid's default title, for figures drawn without it
    "mechlingo.viz.palette",
    "mechlingo.viz.lens",
    # "tuned" is also a retired template-family name and a glossary word with three meanings
    "mechlingo.data.io",
    "mechlingo.cli.glossary",
}


def _strings(tree: ast.AST) -> Sequence[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)}  # fmt: skip
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs]  # fmt: skip


def test_no_module_names_a_decoder_but_its_own():
    own = {s.name: s.factory.__module__ for s in registry.decoder_specs()}
    root = Path(registry.__file__).parents[3]
    found = []
    for path in sorted((root / "mechlingo").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _strings(tree):
            if node.value in own and own[node.value] != module:
                found.append((module, node.lineno, node.value))
    stray = [f for f in found if f[0] not in NAMED_ELSEWHERE]
    assert not stray, f"decoder names outside their own modules: {stray}"
    # the allow-list is no wider than it needs to be
    assert {f[0] for f in found} == NAMED_ELSEWHERE
