"""``--dry-run`` and the estimate every long command prints before it starts.

Each ``plan_*`` function counts, from the checked flags and the data already read (never the
model's weights: its layer count and size come from its ``config.json``,
:func:`mechlingo.core.costs.model_shape`), what the command will score, and turns the counts
into an :class:`~mechlingo.core.costs.Estimate` with the measured per-item costs
(:data:`mechlingo.core.costs.SECONDS_PER_ITEM`). :func:`announce` prints the plan and the
estimate on stderr; with ``--dry-run`` the command stops there (exit 0, nothing written).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mechlingo.analyses.decoders.registry import DecoderUse
from mechlingo.cli.glossary import about
from mechlingo.core.costs import EMBEDDED_LAYERS, Estimate, ModelSize, estimate, model_shape

__all__ = [
    "CostPlan",
    "add_dry_run_arg",
    "announce",
    "plan_align",
    "plan_circuit",
    "plan_eval",
    "plan_experts",
    "plan_lens",
    "plan_steer_build",
    "plan_steer_eval",
    "plan_trace",
    "plan_tuned_lens",
]

#: positions of the corrupted-subject sweep (the subject's first and last token, the last
#: two prompt tokens: :mod:`mechlingo.cli.trace`)
PATCH_POSITIONS = 4


@dataclass
class CostPlan:
    """What a command will score (``lines``, for a reader) and its :class:`Estimate`."""

    command: str
    lines: list[str]
    estimate: Estimate

    def __str__(self) -> str:
        return "\n".join([f"plan of mechlingo {self.command}:", *[f"  {x}" for x in self.lines],
                          str(self.estimate)])  # fmt: skip


def add_dry_run_arg(p: argparse.ArgumentParser) -> None:
    """``--dry-run``: print the plan and the estimate, load no model, write nothing."""
    p.add_argument("--dry-run", action="store_true", help=about("--dry-run", "every check "
                   "that needs no model runs first"))  # fmt: skip


def announce(plan: CostPlan, args: argparse.Namespace) -> bool:
    """Print ``plan`` on stderr (unless ``--quiet`` without ``--dry-run``); returns whether
    the command stops here (``--dry-run``)."""
    dry = bool(getattr(args, "dry_run", False))
    if dry or not getattr(args, "quiet", False):
        print(str(plan), file=sys.stderr if not dry else sys.stdout)
    return dry


def _layers(shape: ModelSize, notes: list[str]) -> int:
    if shape.n_layers is None:
        notes.append(f"layer count unknown for {shape.source}: counted as the embedded "
                     f"model's {EMBEDDED_LAYERS}")  # fmt: skip
        return EMBEDDED_LAYERS
    return shape.n_layers


def _by_lang(facts: Sequence[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in facts:
        out[f.lang] = out.get(f.lang, 0) + 1
    return out


def _langs_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{lg} {n}" for lg, n in counts.items())


def plan_eval(
    facts: Sequence[Any], metric: str, max_new_tokens: int, model: str | None
) -> CostPlan:
    """``eval``: one prompt pass per fact and its generated tokens (``klar``: 10)."""
    shape, notes = model_shape(model), list[str]()
    n = len(facts)
    tokens = 10 if metric == "klar" else max_new_tokens
    if metric == "rank":
        cands = sum(len(getattr(f, "candidates", None) or [f.answer]) for f in facts)
        counts = {"prompt": float(cands)}
        notes.append("rank: one forward pass per candidate sentence")
    else:
        counts = {"prompt": float(n), "token": float(n * tokens)}
        notes.append("every prompt counted at its full generation length (rows that are "
                     "decided early stop sooner)")  # fmt: skip
    if metric == "klar":
        notes.append("klar's 3-shot prompts are longer than the prompts measured")
    lines = [f"facts: {n} ({_langs_text(_by_lang(facts))})", f"metric: {metric}, "
             f"{tokens if metric != 'rank' else 0} generated tokens per fact"]  # fmt: skip
    return CostPlan("eval", lines, estimate(counts, shape, notes))


def plan_trace(
    facts: Sequence[Any], *, max_new_tokens: int, patch_prompts: int, sites: Sequence[str],
    method: str, model: str | None, circuit_prompts: int = 0, circuit_passes: int = 0,
) -> CostPlan:  # fmt: skip
    """``trace``: the lens and a generation per fact, then per language ``patch_prompts``
    prompts patched at every layer x :data:`PATCH_POSITIONS` x site (exact) and knocked out
    at every layer, and up to ``circuit_prompts`` prompts through the measured circuit
    (each ``circuit_passes`` prompt passes' worth: :data:`.trace_circuit.CIRCUIT_PASSES`)."""
    shape, notes = model_shape(model), list[str]()
    n_layers = _layers(shape, notes)
    langs = _by_lang(facts)
    patched = len(langs) * patch_prompts
    cells = patched * n_layers * PATCH_POSITIONS * len(sites) if method != "atp" else 0
    circ = sum(min(circuit_prompts, n) for n in langs.values()) * circuit_passes
    counts = {"prompt": float(len(facts) + patched * (n_layers + (3 if method != "exact" else 0))
                              + circ),
              "token": float(len(facts) * max_new_tokens), "patch_cell": float(cells)}  # fmt: skip
    if method != "exact":
        notes.append("attribution patching counted as three passes per prompt")
    lines = [f"facts: {len(facts)} ({_langs_text(langs)}), {max_new_tokens} generated tokens each",
             f"patching ({method}): {patch_prompts} prompt(s) per language x {n_layers} layers "
             f"x {PATCH_POSITIONS} positions x sites {','.join(sites)} = {cells:,} patched "
             "copies; the knockout: one pass per layer and prompt"]  # fmt: skip
    if circuit_prompts:
        lines.append(f"measured circuit (EAP-IG): up to {circuit_prompts} correctly answered "
                     f"prompt(s) per language, each {circuit_passes} prompt passes' worth = "
                     f"at most {circ:,} (--circuit-prompts 0 skips it)")  # fmt: skip
    return CostPlan("trace", lines, estimate(counts, shape, notes))


def plan_experts(
    texts: Mapping[str, Sequence[str]], targets: Sequence[str], ks: Sequence[int], *,
    heldout: int | None, samples: int, max_new_tokens: int, model: str | None,
) -> CostPlan:  # fmt: skip
    """``experts``: one statistics pass per sentence, then per target and k two arms (experts,
    random) of ``samples`` BOS samples and the held-out perplexity in every language."""
    shape, notes = model_shape(model), list[str]()
    sents = sum(len(v) for v in texts.values())
    arms = len(targets) * (1 + 2 * len(ks)) if heldout is not None else 0
    held = arms * heldout * len(texts) if heldout is not None else 0
    counts = {"sentence": float(sents + held), "prompt": float(arms * samples),
              "token": float(arms * samples * max_new_tokens)}  # fmt: skip
    notes.append("the k curve's arms counted as one unclamped arm per target plus experts "
                 "and random at each k")  # fmt: skip
    lines = [f"sentences: {sents} ({len(texts)} languages) for the neuron statistics",
             f"targets {','.join(targets)}, k in {list(ks)}: " + (
                 "no k curve" if heldout is None else
                 f"{arms} arms x ({samples} BOS samples of {max_new_tokens} tokens + "
                 f"{heldout} held-out lines x {len(texts)} languages)")]  # fmt: skip
    return CostPlan("experts", lines, estimate(counts, shape, notes))


def plan_align(texts: Mapping[str, Sequence[str]], clamp: bool, model: str | None) -> CostPlan:
    """``align``: every sentence embedded once, and with a clamp twice more (clamp, control)."""
    shape = model_shape(model)
    sents = sum(len(v) for v in texts.values())
    passes = 3 if clamp else 1
    lines = [f"sentences: {sents} ({len(texts)} languages) x {passes} pass(es) "
             + ("(no clamp, clamp, control)" if clamp else "(no clamp)")]  # fmt: skip
    return CostPlan("align", lines, estimate({"sentence": float(sents * passes)}, shape))


def plan_tuned_lens(steps: int, texts_per_step: int, heldout: int, model: str | None) -> CostPlan:
    """``tuned-lens``: ``steps`` optimizer steps and one held-out pass per held-out text."""
    shape, notes = model_shape(model), list[str]()
    if texts_per_step != 8:
        notes.append(f"a step was measured with 8 texts; counted x{texts_per_step / 8:.2f}")
    counts = {"lens_step": steps * texts_per_step / 8, "sentence": float(heldout)}
    lines = [f"{steps} steps of {texts_per_step} texts", f"held-out texts: {heldout}"]
    return CostPlan("tuned-lens", lines, estimate(counts, shape, notes))


def plan_steer_eval(
    splits: Mapping[str, Sequence[Any]], *, grid: Any, seeds: int, repeats: int,
    max_new_tokens: int, transfer: str | None, sweep: bool = True, model: str | None,
) -> CostPlan:  # fmt: skip
    """``steer eval``: per repeat the headroom (zero- and k-shot on dev), the dev sweep (every
    layer x alpha of each vector on the screen ids, the best ``top_k`` of each and their
    pairs on dev) and the test conditions (``orig``, ``task``, ``diff``, ``both`` and one
    random control per seed; without ``sweep``, ``--config``, only the test); every scored
    prompt is one prompt pass and its tokens."""
    shape, notes = model_shape(model), list[str]()
    n_layers = _layers(shape, notes)
    task_layers, diff_layers = grid.layers(n_layers)
    dev, test = len(splits.get("dev", [])), len(splits.get("test", []))
    langs = max(1, len({f.lang for f in splits.get("dev", [])}))
    screen = min(dev, (grid.screen_ids or dev // langs) * langs)
    settings = len(task_layers) * len(grid.task_alphas) + len(diff_layers) * len(grid.diff_alphas)
    per_repeat = {"headroom": 2 * dev, "screen": settings * screen,
                  "dev": (2 * grid.top_k + grid.top_k**2 + 1) * dev, "test": (4 + seeds) * test}  # fmt: skip
    if not sweep:
        per_repeat.update(screen=0, dev=0)
    items = repeats * sum(per_repeat.values())
    counts = {"prompt": float(items), "token": float(items * max_new_tokens)}
    if transfer:
        notes.append("the transfer matrix (--transfer) is not in this estimate: "
                     "docs/methods/repair-vectors.md gives its measured time")  # fmt: skip
    if repeats > 1:
        notes.append("the vectors rebuilt for each further repeat are not counted")
    lines = [f"dev items {dev}, test items {test} ({langs} languages); {repeats} repeat(s)",
             f"sweep: {settings} settings on {screen} screen items, the best {grid.top_k} of "
             "each vector and their pairs on dev",
             f"test conditions: orig, task, diff, both and {seeds} random control(s)",
             "scored prompts per repeat: " + ", ".join(f"{k} {v:,}" for k, v in per_repeat.items())]  # fmt: skip
    return CostPlan("steer eval", lines, estimate(counts, shape, notes))


def _positions(text: str) -> int:
    """A prompt's token count without a tokenizer: BOS plus its words, or one token per 8
    UTF-8 bytes for text without spaces (Chinese, Japanese), whichever is more."""
    return 1 + max(len(text.split()), -(-len(text.encode("utf-8")) // 8))


def plan_lens(
    facts: Sequence[Any], decoders: Sequence[DecoderUse | str], *, prompts: Sequence[str] = (),
    model: str | None,
) -> CostPlan:  # fmt: skip
    """``lens``: one lens read per fact per decoder (``--prompt``: each position of each
    text), plus each decoder's own passes from its registered cost model
    (:class:`~mechlingo.analyses.decoders.registry.DecoderSpec`): ``layer_passes`` forward
    passes per prompt and layer (the patchscope's target prompt) and, for a decoder that
    generates, its ``max_new_tokens`` tokens at each layer. A name stands for the decoder
    with its default options."""
    shape, notes = model_shape(model), list[str]()
    n_layers = _layers(shape, notes)
    n = len(prompts) if prompts else len(facts)
    uses = [DecoderUse(d, d) if isinstance(d, str) else d for d in decoders]
    passes = sum(u.spec.layer_passes for u in uses)
    tokens = sum(int(u.spec.option_values(u.options).get("max_new_tokens") or 0)
                 for u in uses if u.spec.generates)  # fmt: skip
    positions = sum(_positions(p) for p in prompts)
    counts = {
        "lens_read": float(0 if prompts else n * len(uses)),
        "lens_position": float(positions * len(uses)),
        "prompt": float(n * n_layers * passes),
        "token": float(n * n_layers * tokens),
    }
    if prompts:
        notes.append(f"positions counted from the text ({positions}: BOS and the words, or "
                     "a token per 8 bytes), not by the tokenizer")  # fmt: skip
    what = f"prompts: {n} (--prompt)" if prompts else f"facts: {n} ({_langs_text(_by_lang(facts))})"
    own = [f"{u.label}: {u.spec.layer_passes:g} pass(es) of its own per layer ({n_layers})"
           for u in uses if u.spec.layer_passes]  # fmt: skip
    lines = [what, f"decoders: {', '.join(u.label for u in uses)}" + "".join(f"; {x}" for x in own)]
    return CostPlan("lens", lines, estimate(counts, shape, notes))


def plan_steer_build(prompt_sets: Mapping[str, Sequence[str]], model: str | None) -> CostPlan:
    """``steer build``: one pass per prompt of each set (few-shot, zero-shot, translation)
    and one more over the zero-shot prompts for the residual norms."""
    shape = model_shape(model)
    sizes = {k: len(v) for k, v in prompt_sets.items()}
    passes = sum(sizes.values()) + sizes.get("zero_shot", 0)
    lines = ["build prompts: " + ", ".join(f"{k} {v}" for k, v in sizes.items()),
             f"plus {sizes.get('zero_shot', 0)} zero-shot passes for the residual norms"]  # fmt: skip
    return CostPlan("steer build", lines, estimate({"prompt": float(passes)}, shape))


#: sizes of the faithfulness curve (:data:`mechlingo.analyses.circuits.result.SIZES`)
CURVE_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def graph_edges(n_layers: int) -> int:
    """Edges of a graph of sequential blocks with one attention and one MLP sender per
    layer (the embeddings, ``2L`` senders; ``2L + 1`` receivers): ``2L^2 + 3L + 1`` (703
    for the embedded model's 18 layers)."""
    return 2 * n_layers**2 + 3 * n_layers + 1


def plan_circuit(
    facts: Sequence[Any], *, prompts: int, steps: int, verify: int, groups: int,
    max_new_tokens: int, model: str | None,
) -> CostPlan:  # fmt: skip
    """``circuit``: per language a greedy generation per fact (which are answered
    correctly), then on at most ``prompts`` pairs the edge scores (one corrupted forward,
    ``steps`` forwards and their backward, counted as two forwards each), exact patching (one
    corrupted pass, then one patched pass per verified edge and per curve point) and, for
    every other language, its circuit on these pairs (a corrupted and a patched pass). A
    patched pass is counted as two forwards (measured: 1.7 on the embedded model)."""
    shape, notes = model_shape(model), list[str]()
    n_layers = _layers(shape, notes)
    langs = _by_lang(facts)
    total = graph_edges(n_layers) * groups
    points = len({min(n, total) for n in (*CURVE_SIZES, total)})
    pairs = {lg: min(n, prompts) for lg, n in langs.items()}
    others = len(langs) - 1
    patched = min(verify, total) + points + others
    per_pair = 1 + 3 * steps + 1 + others + 2 * patched
    passes = sum(pairs.values()) * per_pair
    counts = {"prompt": float(len(facts) + passes), "token": float(len(facts) * max_new_tokens)}
    notes.append("every language counted with all its facts answered correctly (at most "
                 f"{prompts} pairs each)")  # fmt: skip
    lines = [f"facts: {len(facts)} ({_langs_text(langs)}), {max_new_tokens} generated tokens "
             "each to keep the correctly answered ones",
             f"graph: {graph_edges(n_layers):,} edges x {groups} position group(s) = {total:,} "
             "(layer-level senders of sequential blocks, from the layer count)",
             f"per pair: 1 + 3 x {steps} IG step(s) for the scores; {2 + others} corrupted "
             f"passes and {patched} patched ones ({min(verify, total)} verified edges, "
             f"{points} curve points, {others} other language(s)), a patched pass counted as "
             f"two: {per_pair} forward passes"]  # fmt: skip
    return CostPlan("circuit", lines, estimate(counts, shape, notes))
