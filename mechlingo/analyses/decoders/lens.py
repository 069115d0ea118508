"""Per-language logit lens and latent-language curves.

For each prompt, the residual stream at its last real token is read after every block
through the model's final norm and unembedding (the logit lens, nostalgebraist 2020). For each
*track* -- the answer in the prompt's own language, the English answer, the answer in any other
language -- we keep the probability mass of its answer token set, the log-probability of its
primary token and the rank of its best token, layer by layer. Averaged per prompt language
these are the latent-language curves of Wendler et al. (2024): when the English answer's
probability rises in the middle layers before the target-language answer takes over at the
end, the model is recalling "in English" and translating late (Lu et al. 2025).

Layer convention: entry ``l`` is the residual stream after ``l`` blocks, so entry 0 is the
embedding (``blocks.0.hook_resid_pre``), entry ``l < n`` is ``blocks.l.hook_resid_pre`` and
entry ``n`` is the final ``blocks.{n-1}.hook_resid_post``, which reproduces the model's own
output. This is the stack TransformerLens's ``logit_lens`` reads, in the same order.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import collect
from mechlingo.analyses.decoders.entries import lens_hook_names, resolve_entries
from mechlingo.analyses.decoders.logit import LOGIT
from mechlingo.analyses.decoders.registry import Decoder, as_decoder, generates
from mechlingo.analyses.decoders.tokens import TokenGrid, token_grid
from mechlingo.core.answers import answer_tokens, pack_token_sets
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.distributed import (
    gather_lists,
    scoring_sharded,
    shard_by_cost,
    sharded_scoring,
)
from mechlingo.core.errors import InputError
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import TokenBatch, encode, sorted_batches
from mechlingo.core.types import Model
from mechlingo.data.fact_answers import fact_answers, mismatch_tracks
from mechlingo.data.langid import identify_language
from mechlingo.kernels.readout import Readout, read_logits, token_energy
from mechlingo.viz.lens import latent_curves_figure, lens_heatmap, token_grid_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact


__all__ = [
    "LensArgs",
    "LensFactsArgs",
    "LensResult",
    "LensRunArgs",
    "LensRunOptions",
    "lens_facts",
    "lens_hook_names",
    "lens_with_mismatch",
    "logit_lens",
    "resolve_decoder",
    "token_energy",
]


@dataclass
class LensResult:
    """A per-language logit lens over a set of prompts.

    Attributes:
        prompts: the prompts, in input order.
        langs: language of each prompt.
        tracks: names of the answer tracks (``"answer"`` = the prompt's own-language answer,
            language codes such as ``"en"`` = the same fact's answer in that language).
        answers: ``answers[track][i]``, the word tracked for prompt i.
        layers: lens entries read (``l`` = after ``l`` blocks; the last is the output).
        logprob: ``[layer, prompt, track]`` log of the answer token set's probability mass.
        primary_logprob: ``[layer, prompt, track]`` log-probability of the primary token.
        rank: ``[layer, prompt, track]`` rank of the best token of the set (0 = top-1).
        top_ids, top_logprobs: ``[layer, prompt, k]`` most likely tokens per entry.
        top_tokens: the same tokens decoded.
        n_answer_tokens: ``[prompt, track]`` how many tokens each answer takes.
        ids: optional fact id per prompt.
        n_layers: number of blocks of the model.
        entropy: ``[layer, prompt]`` entropy (nats) of the decoder's next-token
            distribution.
        energy: ``[layer, prompt]`` token energy of the decoded vector (see
            :func:`token_energy`: 1 = as much as a random direction, higher = closer to
            the directions the unembedding reads).
        decoder: the name of the decoder that read the entries (a registered one:
            :func:`~mechlingo.analyses.decoders.registry.decoder_names`).
        tokens: the token-level lens (the top tokens of every entry at every position of
            every prompt: :class:`~mechlingo.analyses.decoders.tokens.TokenGrid`), when
            computed (always without answer tracks; :meth:`fig_tokens` draws it).
    """

    prompts: list[str]
    langs: list[str]
    tracks: list[str]
    answers: dict[str, list[str]]
    layers: list[int]
    logprob: Float[Tensor, "layer prompt track"]
    primary_logprob: Float[Tensor, "layer prompt track"]
    rank: Int[Tensor, "layer prompt track"]
    top_ids: Int[Tensor, "layer prompt k"]
    top_logprobs: Float[Tensor, "layer prompt k"]
    top_tokens: list[list[list[str]]]
    n_answer_tokens: Int[Tensor, "prompt track"]
    n_layers: int
    ids: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    entropy: Float[Tensor, "layer prompt"] | None = None
    energy: Float[Tensor, "layer prompt"] | None = None
    decoder: str = LOGIT
    tokens: TokenGrid | None = None

    # ------------------------------------------------------------------ accessors
    def track_index(self, track: str) -> int:
        if track not in self.tracks:
            raise KeyError(f"unknown track {track!r}; tracks: {self.tracks}")
        return self.tracks.index(track)

    def prob(self, track: str) -> Float[Tensor, "layer prompt"]:
        """Probability mass of ``track``'s answer set per entry and prompt."""
        return self.logprob[:, :, self.track_index(track)].exp()

    def first_layer_within(
        self, track: str, max_rank: int, *, before_last: bool = False
    ) -> Int[Tensor, " prompt"]:
        """Per prompt, the first lens entry where ``track`` reaches rank <= ``max_rank``
        (``-1`` if never; with ``before_last`` the output entry is not considered)."""
        r = self.rank[:, :, self.track_index(track)]
        if before_last:
            r = r[:-1]
        hit = r <= max_rank
        first = torch.where(hit.any(0), hit.float().argmax(0), torch.tensor(-1))
        layers = torch.tensor(self.layers[: r.shape[0]])
        return torch.where(first >= 0, layers[first.clamp_min(0)], torch.tensor(-1))

    def final_top1(self, track: str = "answer") -> Tensor:
        """Whether the model's top next token is in ``track``'s answer set at the output."""
        if self.layers[-1] != self.n_layers:
            raise InputError("the lens did not read the final entry")
        return self.rank[-1, :, self.track_index(track)] == 0

    # ------------------------------------------------------------------ tables
    def to_dataframe(self) -> pd.DataFrame:
        """One row per (entry, prompt, track): log-probability, probability, rank, the
        entry's top token."""
        import pandas as pd

        n_l, n_p, n_t = self.logprob.shape
        rows = []
        lp = self.logprob.tolist()
        plp = self.primary_logprob.tolist()
        rk = self.rank.tolist()
        for li in range(n_l):
            for p in range(n_p):
                for t in range(n_t):
                    rows.append(
                        {
                            "layer": self.layers[li],
                            "prompt": p,
                            "id": self.ids[p] if self.ids else None,
                            "lang": self.langs[p],
                            "track": self.tracks[t],
                            "answer": self.answers[self.tracks[t]][p],
                            "logprob": lp[li][p][t],
                            "prob": float(torch.tensor(lp[li][p][t]).exp()),
                            "primary_logprob": plp[li][p][t],
                            "rank": rk[li][p][t],
                            "top1": self.top_tokens[li][p][0] if self.top_tokens[li][p] else "",
                        }
                    )
        return pd.DataFrame(rows)

    def latent_curves(self) -> pd.DataFrame:
        """Mean, standard deviation, median, quartiles (``q25``, ``q75``) and count of each
        track's probability per prompt language and entry: the latent-language curves."""
        df = self.to_dataframe()
        g = df.groupby(["lang", "track", "layer"])["prob"]
        out = g.agg(["mean", "std", "median", "count"])
        out["q25"] = g.quantile(0.25)
        out["q75"] = g.quantile(0.75)
        return out.reset_index().fillna({"std": 0.0})

    def summary(self, *, max_rank: int = 10) -> dict[str, Any]:
        """Headline numbers per prompt language: the share of prompts whose output top token
        is the answer (final-layer accuracy), and the share whose English answer reaches
        rank <= ``max_rank`` at some entry before the output."""
        out: dict[str, Any] = {"final_layer_accuracy": {}, "english_decodable_before_last": {}}
        final = self.layers[-1] == self.n_layers and "answer" in self.tracks
        top1 = self.final_top1("answer") if final else None
        en = (
            self.first_layer_within("en", max_rank, before_last=True)
            if "en" in self.tracks
            else None
        )
        for lang in sorted(set(self.langs)):
            idx = torch.tensor([i for i, lg in enumerate(self.langs) if lg == lang])
            if top1 is not None:
                out["final_layer_accuracy"][lang] = float(top1[idx].float().mean())
            if en is not None:
                out["english_decodable_before_last"][lang] = float((en[idx] >= 0).float().mean())
        out["max_rank"] = max_rank
        out["n_prompts"] = {lg: self.langs.count(lg) for lg in sorted(set(self.langs))}
        return out

    # ------------------------------------------------------------------ figures
    def fig_latent_curves(self, tracks: Sequence[str] | None = None) -> go.Figure:
        """Latent-language curves: one panel per prompt language, median probability of each
        track per entry with its interquartile band."""
        if not self.tracks:
            raise InputError("no answer tracks: this lens read tokens only; draw fig_tokens()")
        return latent_curves_figure(self.latent_curves(), tracks=tracks, n_layers=self.n_layers)

    def fig_heatmap(self, track: str = "en", value: str = "rank") -> go.Figure:
        """Entry-by-prompt heatmap of ``track``'s rank (log scale) or probability."""

        t = self.track_index(track)
        return lens_heatmap(
            self.rank[:, :, t],
            self.logprob[:, :, t],
            layers=self.layers,
            prompts=self.prompts,
            langs=self.langs,
            answers=self.answers[track],
            top_tokens=self.top_tokens,
            track=track,
            value=value,
        )

    def fig_tokens(self, prompt: int = 0, color: str = "prob") -> go.Figure:
        """The token-level lens of one prompt: positions (x) by entries (y), each cell the
        top token there; ``color`` ``"prob"`` (its probability) or ``"lang"`` (its
        language); hover: the top tokens with probabilities and languages.

        Raises:
            InputError: the lens did not read every position (call :func:`logit_lens`
                without answers, or with ``tokens=True``), or ``prompt`` is out of range.
        """
        g = self.tokens
        if g is None:
            raise InputError(
                "this lens read the last token only",
                fix="call logit_lens(model, prompts) without answers, or with tokens=True",
            )
        if not 0 <= prompt < len(g.tokens):
            raise InputError(f"prompt {prompt} out of range: the lens read {len(g.tokens)}")
        return token_grid_figure(
            g.tokens[prompt],
            g.top_tokens[prompt],
            g.top_logprobs[prompt].exp(),
            g.top_langs[prompt],
            layers=g.layers,
            color=color,
            decoder=self.decoder,
            prompt_lang=self.langs[prompt],
        )

    def __repr__(self) -> str:
        what = f"tracks {self.tracks}" if self.tracks else "tokens at every position"
        return (
            f"LensResult({self.decoder} lens, {len(self.prompts)} prompts, entries "
            f"{self.layers[0]}..{self.layers[-1]}, {what})"
        )

    def _repr_html_(self) -> str:
        if not self.tracks:
            return f"<b>{html.escape(repr(self))}</b>" + (
                "<p>draw <code>fig_tokens(i)</code> for prompt i</p>"
            )
        s = self.summary()
        rows = "".join(
            f"<tr><td>{lg}</td><td>{s['n_prompts'][lg]}</td>"
            f"<td>{s['final_layer_accuracy'].get(lg, float('nan')):.2f}</td>"
            f"<td>{s['english_decodable_before_last'].get(lg, float('nan')):.2f}</td></tr>"
            for lg in s["n_prompts"]
        )
        return (
            f"<b>LensResult</b>: {len(self.prompts)} prompts, entries {self.layers[0]}.."
            f"{self.layers[-1]}, tracks {self.tracks}<table><tr><th>lang</th><th>n</th>"
            f"<th>final top-1</th><th>en rank&le;10 before last</th></tr>{rows}</table>"
        )


def _checked_langs(
    prompts: list[str], answers: Mapping[str, Sequence[str]], langs: Sequence[str] | None
) -> list[str]:
    """The language of each prompt (default: identified from its text,
    :func:`~mechlingo.data.langid.identify_language`, English when unsure), after checking
    the inputs' sizes."""
    if not prompts:
        raise InputError("no prompts given to the logit lens")
    langs = list(langs) if langs is not None else [identify_language(p) or "en" for p in prompts]
    for name, words in answers.items():
        if len(words) != len(prompts):
            raise InputError(f"track {name!r} has {len(words)} answers for {len(prompts)} prompts")
    if len(langs) != len(prompts):
        raise InputError(f"{len(langs)} languages for {len(prompts)} prompts")
    return langs


@dataclass
class _LensReads:
    """What the lens keeps per entry, prompt and track (or top-k slot)."""

    logprob: Tensor  # [entry, prompt, track]
    primary: Tensor  # [entry, prompt, track]
    rank: Tensor  # [entry, prompt, track]
    top_ids: Tensor  # [entry, prompt, k]
    top_lp: Tensor  # [entry, prompt, k]
    entropy: Tensor  # [entry, prompt]
    energy: Tensor  # [entry, prompt]

    @classmethod
    def empty(cls, n_e: int, n_p: int, n_t: int, k: int, dev: torch.device) -> _LensReads:
        f, i = {"device": dev}, {"dtype": torch.long, "device": dev}
        return cls(
            torch.empty(n_e, n_p, n_t, **f),
            torch.empty(n_e, n_p, n_t, **f),
            torch.empty(n_e, n_p, n_t, **i),
            torch.empty(n_e, n_p, k, **i),
            torch.empty(n_e, n_p, k, **f),
            torch.empty(n_e, n_p, **f),
            torch.empty(n_e, n_p, **f),
        )

    def put(self, rows: list[int], r: Readout) -> None:
        """Store the readout of ``[entry, row]``-ordered rows for prompts ``rows``."""
        n_e, _, n_t = self.logprob.shape
        shape, top = (n_e, len(rows), n_t), (n_e, len(rows), self.top_ids.shape[-1])
        idx = torch.tensor(rows, device=self.logprob.device)
        self.logprob[:, idx] = r.set_logprob.reshape(shape)
        self.primary[:, idx] = r.primary_logprob.reshape(shape)
        self.rank[:, idx] = r.set_rank.reshape(shape)
        self.top_ids[:, idx] = r.top_ids.reshape(top)
        self.top_lp[:, idx] = r.top_logprobs.reshape(top)
        self.entropy[:, idx] = r.entropy.reshape(n_e, len(rows))
        assert r.energy is not None, "the lens reads with energy=True"
        self.energy[:, idx] = r.energy.reshape(n_e, len(rows))

    def cpu(self) -> _LensReads:
        """One copy to the host at the end, not one per batch."""
        t = (self.logprob, self.primary, self.rank, self.top_ids, self.top_lp)
        return _LensReads(*(x.cpu() for x in (*t, self.entropy, self.energy)))


def _top_tokens(model: Model, top_ids: Int[Tensor, "entry prompt k"]) -> list[list[list[str]]]:
    """The top tokens decoded, ``[entry][prompt][k]``."""
    n_e, n_p, k = top_ids.shape
    decoded = model.tokenizer.batch_decode([[i] for i in top_ids.reshape(-1).tolist()])
    return [
        [decoded[(li * n_p + p) * k : (li * n_p + p + 1) * k] for p in range(n_p)]
        for li in range(n_e)
    ]


class LensRunArgs(TypedDict, total=False):
    """How :func:`logit_lens` runs (not what it reads): :class:`LensRunOptions`' fields, whose
    defaults they take."""

    batch_size: int
    chunk_rows: int
    progress: bool


@dataclass(frozen=True)
class LensRunOptions:
    """How a lens runs (the keywords :class:`LensRunArgs` of :func:`logit_lens`, whose
    defaults are these), checked when made.

    Attributes:
        batch_size: prompts per forward pass.
        chunk_rows: rows per unembedding matmul (the unembedding is read once per chunk;
            memory about two ``chunk_rows x vocab`` float32 arrays: 0.5 GB for 256 x 262,144).
        progress: show a progress bar.
    """

    batch_size: int = BATCH_SIZE
    chunk_rows: int = 256
    progress: bool = PROGRESS

    def __post_init__(self) -> None:
        for name in ("batch_size", "chunk_rows"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"{name} must be an integer of at least 1, got {v!r}")


class LensArgs(TypedDict, total=False):
    """The keywords of :func:`logit_lens` that :func:`lens_facts` (and
    :func:`~mechlingo.analyses.decoders.compare.compare_decoders`) pass on; their meaning and
    defaults are :func:`logit_lens`'s."""

    layers: Any
    top_k: int
    batch_size: int
    chunk_rows: int
    progress: bool
    tokens: bool | None


class LensFactsArgs(TypedDict, total=False):
    """The keywords of :func:`lens_facts` besides the decoder (what
    :func:`~mechlingo.analyses.decoders.compare.compare_decoders` passes to every call):
    :class:`LensArgs` and the fact-side ones."""

    layers: Any
    top_k: int
    batch_size: int
    chunk_rows: int
    progress: bool
    tokens: bool | None
    track_langs: Sequence[str]
    pool: Sequence[Fact] | None
    decoder_options: Mapping[str, Any] | None


def logit_lens(
    model: Model,
    prompts: Sequence[str],
    answers: Mapping[str, Sequence[str]] | None = None,
    *,
    langs: Sequence[str] | None = None,
    layers: Any = None,
    top_k: int = 5,
    ids: Sequence[str] | None = None,
    decoder: Decoder | None = None,
    tokens: bool | None = None,
    **run: Unpack[LensRunArgs],
) -> LensResult:
    """Run the per-language logit lens (or another decoder over the same entries).

    Args:
        model: a TransformerLens model.
        prompts: prompts of any lengths and languages; each is read at its own last real token.
        answers: ``{track: [word per prompt]}``, e.g. ``{"answer": [...], "en": [...]}``;
            none (or empty) reads the prompts without answers: the token-level lens.
        langs: language of each prompt (decides whether answers continue with a space;
            default: identified from the prompt's text, English when unsure).
        layers: lens entries to read (default all, ``0..n_layers``).
        top_k: top tokens to keep per entry (and per position for the token-level lens).
        batch_size, chunk_rows, progress: how it runs (:class:`LensRunOptions`, whose
            defaults they take): prompts per forward pass, rows per unembedding matmul.
        ids: optional fact ids, carried into the result.
        decoder: a :class:`~mechlingo.analyses.decoders.registry.Decoder` (``None``: the
            logit lens), e.g. a :class:`~mechlingo.analyses.decoders.tuned_lens.TunedLens`
            (translators applied before the readout) or a
            :class:`~mechlingo.analyses.decoders.patchscope.Patchscope` (the states are patched
            into target prompts and the target's next-token distribution is read).
        tokens: read every position too (the result's ``tokens``,
            :meth:`LensResult.fig_tokens`); default: only when there are no answers.

    Returns:
        A :class:`LensResult`; without answers its tracks are empty and its last-token
        arrays (``top_ids``, ``entropy``, ...) are the token grid's last position.

    Raises:
        InputError: no prompts, answers or languages not one per prompt, or an entry out
            of range.
        ModelMismatchError: a tuned lens trained on another model.
    """
    dec = as_decoder(decoder, model)
    ro = LensRunOptions(**run)
    prompts = list(prompts)
    answers = dict(answers or {})
    langs = _checked_langs(prompts, answers, langs)
    entries = resolve_entries(model, layers)
    names = lens_hook_names(model, entries)
    batch = encode(model, prompts)
    grid = None
    if tokens or (tokens is None and not answers):
        grid = token_grid(model, batch, entries, names, langs=langs, decoder=dec,
                          top_k=top_k, batch_size=ro.batch_size, chunk_rows=ro.chunk_rows,
                          progress=ro.progress)  # fmt: skip
    if answers:
        reads, n_tokens, continuations = _last_token_reads(
            model, batch, answers, langs, entries, names, dec, top_k, ro
        )  # fmt: skip
    else:
        assert grid is not None
        reads, n_tokens, continuations = _grid_last(grid), None, None
    result = LensResult(
        prompts=prompts,
        langs=langs,
        tracks=list(answers),
        answers={t: list(answers[t]) for t in answers},
        layers=entries,
        logprob=reads.logprob,
        primary_logprob=reads.primary,
        rank=reads.rank,
        top_ids=reads.top_ids,
        top_logprobs=reads.top_lp,
        top_tokens=_top_tokens(model, reads.top_ids),
        n_answer_tokens=n_tokens
        if n_tokens is not None
        else torch.zeros(len(prompts), 0, dtype=torch.long),
        n_layers=site_map(model).n_layers,
        ids=list(ids) if ids is not None else None,
        entropy=reads.entropy,
        energy=reads.energy,
        decoder=dec.name,
        tokens=grid,
    )
    if continuations is not None:
        result.meta["continuations"] = continuations
    return result


def _grid_last(grid: TokenGrid) -> _LensReads:
    """The last-token arrays of a lens without answers: the token grid's last position
    (no tracks; the token energy is not measured there: NaN)."""
    n_e, n_p = len(grid.layers), len(grid.tokens)
    k = grid.top_ids[0].shape[-1]
    reads = _LensReads.empty(n_e, n_p, 0, k, torch.device("cpu"))
    for p in range(n_p):
        reads.top_ids[:, p] = grid.top_ids[p][:, -1]
        reads.top_lp[:, p] = grid.top_logprobs[p][:, -1]
        reads.entropy[:, p] = grid.entropy[p][:, -1]
    reads.energy.fill_(float("nan"))
    return reads


def _last_token_reads(
    model: Model,
    batch: TokenBatch,
    answers: Mapping[str, Sequence[str]],
    langs: list[str],
    entries: list[int],
    names: list[str],
    decoder: Decoder,
    top_k: int,
    run: LensRunOptions,
) -> tuple[_LensReads, Tensor, list[list[str]] | None]:
    """The tracks' reads at each prompt's last token (:func:`logit_lens` with answers), the
    tokens per answer, and a patchscope's continuations (``None`` without)."""
    tracks, n_p, n_e = list(answers), len(langs), len(entries)
    reads = _LensReads.empty(n_e, n_p, len(tracks), top_k, model.W_U.device)
    continuations: list[list[str]] = [[""] * n_p for _ in entries]
    sets = [[answer_tokens(model, answers[t][i], lang=langs[i]) for t in tracks]
            for i in range(n_p)]  # fmt: skip
    all_ids, all_primary = pack_token_sets(sets)
    groups = sorted_batches(batch.lengths, run.batch_size)
    generate = generates(decoder)
    sharded = scoring_sharded()  # under torchrun each rank reads its share of the batches
    if sharded:
        cost = [len(g) * max(int(batch.lengths[i]) for i in g) for g in groups]
        groups = [groups[i] for i in shard_by_cost(cost)]
    done = []
    with sharded_scoring(False):  # a rank's own batches: no collective inside
        for rows in tqdm(groups, desc=f"{decoder.name} lens", disable=not run.progress):
            acts = collect(model, batch.select(rows), names)
            stack = torch.stack([acts[nm] for nm in names])  # [entry, b, d_model]
            decoded = decoder.decode(model, entries, stack, [langs[i] for i in rows])
            flat = decoded.flatten(0, 1)  # [entry * b, d_model]
            ids_rows = all_ids[rows].repeat(n_e, 1, 1)
            prim_rows = all_primary[rows].repeat(n_e, 1)
            r = read_logits(model, flat, ids_rows, prim_rows, top_k=top_k,
                            chunk_rows=run.chunk_rows, energy=True)  # fmt: skip
            langs_b = [langs[i] for i in rows]
            gen = None
            if generate:
                gen = decoder.generate(model, entries, stack, langs_b)  # type: ignore[attr-defined]
            done.append((rows, r, gen))
    for rows, r, gen in gather_lists(done) if sharded else done:
        reads.put(rows, r)
        for e in range(n_e if gen is not None else 0):
            for j, i in enumerate(rows):
                continuations[e][i] = gen[e][j]
    n_tokens = torch.tensor([[a.n_tokens for a in row] for row in sets])
    return reads.cpu(), n_tokens, continuations if generate else None


def resolve_decoder(
    model: Model, decoder: str | Decoder | None, options: Mapping[str, Any] | None = None
) -> Decoder:
    """The decoder object for a registered name built with ``options`` (its declared options
    by keyword, :func:`~mechlingo.analyses.decoders.registry.get_decoder`; ``None``: the
    default decoder, the logit lens); objects are checked against ``model`` and pass through.

    Raises:
        InputError: an unknown name, an option out of range, or a required one missing
            (``"tuned"`` without ``tuned_lens``).
        ModelMismatchError: a tuned lens trained on another model.
    """
    return as_decoder(decoder, model, **dict(options or {}))


def lens_facts(
    model: Model,
    facts: Sequence[Fact],
    *,
    track_langs: Sequence[str] = ("en",),
    pool: Sequence[Fact] | None = None,
    decoder: str | Decoder | None = None,
    decoder_options: Mapping[str, Any] | None = None,
    **kwargs: Unpack[LensArgs],
) -> LensResult:
    """A lens over fact prompts, tracking each fact's own answer and its answer in
    ``track_langs`` (English by default).

    ``decoder`` chooses how each entry is read: a registered name (``None``: the logit lens,
    final norm + unembedding; ``"tuned"``: a tuned lens's translator first, give
    ``decoder_options={"tuned_lens": ...}``; ``"patchscope"``: patched into an identity
    target prompt, ``{"target": ..., "max_new_tokens": ...}``), built with
    ``decoder_options`` (each decoder's declared options by keyword:
    :class:`~mechlingo.analyses.decoders.registry.DecoderSpec`), or a decoder object. Every
    decoder gives a :class:`LensResult` over the same entries, prompts and tracks. Other
    keyword arguments go to :func:`logit_lens`."""
    facts = list(facts)
    if not facts:
        raise InputError("no facts selected")
    dec = resolve_decoder(model, decoder, decoder_options)
    answers = fact_answers(facts, track_langs, pool)
    result = logit_lens(
        model,
        [f.prompt for f in facts],
        answers,
        langs=[f.lang for f in facts],
        ids=[f.id for f in facts],
        decoder=dec,
        **kwargs,
    )
    return result


def lens_with_mismatch(
    model: Model, facts: list[Fact], pool: Sequence[Fact] | None, batch_size: int, progress: bool
) -> tuple[LensResult, list[str | None]]:
    """The logit lens tracking :func:`~mechlingo.data.fact_answers.mismatch_tracks` (each
    fact's answer, its English answer and another fact's), with the mismatched words."""
    tracks, mismatch = mismatch_tracks(facts, pool)
    lens = logit_lens(model, [f.prompt for f in facts], tracks, langs=[f.lang for f in facts],
                      ids=[f.id for f in facts], batch_size=batch_size, progress=progress)  # fmt: skip
    return lens, mismatch
