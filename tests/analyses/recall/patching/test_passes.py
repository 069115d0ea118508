"""Activation patching sweeps and attention knockout (tiny model; one small gemma check)."""

from __future__ import annotations

import pytest
import torch
import transformer_lens.patching as tlp

from mechlingo.analyses.recall.patching import (
    PatchingError,
    answer_logprob,
    attention_knockout,
    fact_readouts,
    logit_diff,
    patch_activations,
    subject_token_span,
)
from mechlingo.core.tokens import encode
from mechlingo.data import load_facts
from tests.conftest import corrupted_pair, count_hooks


@pytest.fixture(scope="module")
def pair(tiny):
    return corrupted_pair(tiny)


@pytest.fixture(scope="module")
def readout(tiny):
    return answer_logprob(tiny, ["mat", "the"], name="lp")


def _tl_metric(met):
    ids = [list(s[0].ids) for s in met.sets]

    def fn(logits):
        lp = logits[:, -1].float().log_softmax(-1)
        return torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(len(ids))])

    return fn


def test_source_equals_target_changes_nothing(tiny, pair, readout):
    src, _ = pair
    sw = patch_activations(tiny, src, src, ["resid_pre", "mlp_out", "head"], readout=readout)
    assert torch.allclose(sw.clean, sw.corrupted)
    assert torch.allclose(sw.values, sw.corrupted[:, None, :].expand_as(sw.values), atol=1e-5)


def test_last_layer_resid_patch_reproduces_source(tiny, pair, readout):
    src, tgt = pair
    n = tiny.cfg.n_layers
    sw = patch_activations(
        tiny, src, tgt, "resid_post", layers=[n - 1], positions=[-1], readout=readout
    )
    assert not torch.allclose(sw.clean, sw.corrupted)
    assert torch.allclose(sw.values[:, 0], sw.clean, atol=1e-5)
    assert torch.allclose(sw.normalized(), torch.ones(1), atol=1e-4)


def test_batched_equals_one_cell_at_a_time(tiny, pair, readout):
    src, tgt = pair
    sites = ["resid_pre", "attn_out", "mlp_out", "head"]
    a = patch_activations(tiny, src, tgt, sites, readout=readout, cells_per_batch=1)
    b = patch_activations(tiny, src, tgt, sites, readout=readout, cells_per_batch=64)
    assert a.cells == b.cells
    assert torch.allclose(a.values, b.values, atol=1e-5)


@pytest.mark.parametrize("cells_per_batch", [1, 7, 500])
def test_grown_batch_equals_stacked_batch(tiny, pair, readout, cells_per_batch):
    # "grow" (shared prefix, one pass per example, the batch grows at each layer's block
    # input) must give the numbers of "stack" (every copy runs the whole model), every site
    src, tgt = pair
    sites = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "head"]
    a = patch_activations(
        tiny, src, tgt, sites, readout=readout, batching="stack", cells_per_batch=64
    )
    b = patch_activations(
        tiny, src, tgt, sites, readout=readout, batching="grow", cells_per_batch=cells_per_batch
    )
    assert a.cells == b.cells
    assert (a.values - b.values).abs().max() < 1e-5
    assert torch.allclose(a.corrupted, b.corrupted, atol=1e-5)
    assert count_hooks(tiny) == 0


def test_grown_batch_cross_language_rows_of_different_lengths(tiny):
    # padded target rows of different lengths: each example runs alone, unpadded
    en = load_facts(langs=["en"], relations=["capital"], limit=3)
    ja = load_facts(langs=["ja"], relations=["capital"], limit=3)
    assert len({len(encode(tiny, [f.prompt]).tokens[0]) for f in ja}) > 1
    readouts = fact_readouts(tiny, ja)
    kw = dict(readout=readouts, alignment="subject")
    a = patch_activations(tiny, en, ja, ["resid_pre", "mlp_out"], batching="stack", **kw)
    b = patch_activations(tiny, en, ja, ["resid_pre", "mlp_out"], batching="grow", **kw)
    assert (a.values - b.values).abs().max() < 1e-5


@pytest.mark.parametrize("cells_per_batch", [1, 7, 500])
@pytest.mark.parametrize("positions", [None, [-3, -2, -1], [1, -1]])
def test_shared_prefix_equals_every_position(tiny, pair, readout, cells_per_batch, positions):
    # reusing the unpatched prefix's keys and values (passes start at the first patched
    # position, several examples per pass) gives the numbers of copies that compute every
    # position (reuse_prefix=False) and of "stack", at every site
    src, tgt = pair
    sites = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "head"]
    kw = dict(readout=readout, positions=positions)  # same-shape pair: no alignment
    full = patch_activations(tiny, src, tgt, sites, batching="stack", **kw)
    reused = patch_activations(
        tiny, src, tgt, sites, reuse_prefix=True, cells_per_batch=cells_per_batch, **kw
    )
    assert full.cells == reused.cells
    assert not torch.allclose(full.values, full.corrupted[:, None])  # the patches do act
    assert (full.values - reused.values).abs().max() < 1e-5
    assert torch.allclose(full.corrupted, reused.corrupted, atol=1e-5)
    assert count_hooks(tiny) == 0


def test_shared_prefix_rows_of_different_lengths(tiny):
    # three targets of different lengths in one pass, right-padded and unmasked, positions
    # aligned by subject: equal to one example at a time without prefix reuse
    en = load_facts(langs=["en"], relations=["capital"], limit=3)
    ja = load_facts(langs=["ja"], relations=["capital"], limit=3)
    kw = dict(readout=fact_readouts(tiny, ja), alignment="subject")
    sites = ["resid_pre", "mlp_out", "head"]
    a = patch_activations(tiny, en, ja, sites, reuse_prefix=False, **kw)
    b = patch_activations(tiny, en, ja, sites, reuse_prefix=True, **kw)
    assert (a.values - b.values).abs().max() < 1e-5


def test_reuse_prefix_refused_where_it_cannot_apply(tiny, pair, readout):
    src, tgt = pair
    with pytest.raises(PatchingError, match="batching='grow'"):
        patch_activations(tiny, src, tgt, readout=readout, batching="stack", reuse_prefix=True)


def _brute_parts(starts, weights, base, length):
    from mechlingo.analyses.recall.patching.passes import PASS_COST_POSITIONS

    pos = sorted(set(starts))
    best = None
    for mask in range(2 ** (len(pos) - 1)):  # a cut after pos[i] where bit i is set
        cuts = [0] + [i + 1 for i in range(len(pos) - 1) if mask >> i & 1] + [len(pos)]
        cost = 0.0
        for i, j in zip(cuts, cuts[1:], strict=False):
            rows = base + sum(w for q, w in zip(starts, weights, strict=True) if q in pos[i:j])
            cost += PASS_COST_POSITIONS + rows * (length - pos[i])
        best = cost if best is None else min(best, cost)
    return best


def test_prefix_parts_is_the_cheapest_split():
    from mechlingo.analyses.recall.patching.passes import PASS_COST_POSITIONS, prefix_parts

    # one position: one part; few cells far apart: one pass; many cells far apart: two
    assert prefix_parts([4, 4, 4], [1.0, 1.0, 1.0], 2.0, 9) == [[0, 1, 2]]
    assert prefix_parts([1, 8], [0.1, 0.1], 1.0, 9) == [[0, 1]]
    assert prefix_parts([1, 8] * 50, [1.0] * 100, 1.0, 9) == [
        list(range(0, 100, 2)),
        list(range(1, 100, 2)),
    ]
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        n = int(torch.randint(1, 12, (1,), generator=g))
        length = 12
        starts = torch.randint(0, length, (n,), generator=g).tolist()
        weights = (torch.rand(n, generator=g) * 20).tolist()
        parts = prefix_parts(starts, weights, 3.0, length)
        assert sorted(k for part in parts for k in part) == list(range(n))
        cost = sum(
            PASS_COST_POSITIONS
            + (3.0 + sum(weights[k] for k in part)) * (length - min(starts[k] for k in part))
            for part in parts
        )
        assert cost == pytest.approx(_brute_parts(starts, weights, 3.0, length))


def test_suffix_pass_on_the_recorded_prefix_equals_the_whole_pass(tiny):
    # cached == uncached: positions p.. of each row against the recorded prefix give the
    # recorded final residual stream, for rows of different lengths, at every p
    from mechlingo.activations.prefix import cache_upto, record_prefix, run_on_cache

    batch = encode(tiny, ["The cat sat on the mat", "A dog", "Birds fly south in winter"])
    record = record_prefix(tiny, batch)
    rows = torch.arange(batch.batch_size)
    for p in range(int(batch.lengths.min())):
        cache = cache_upto(tiny, record, rows, p) if p else None
        final = run_on_cache(tiny, batch, cache, p, (), batch.lengths - 1 - p)
        torch.testing.assert_close(final, record.final, rtol=1e-5, atol=1e-5)
    assert count_hooks(tiny) == 0


@pytest.mark.parametrize("reuse_prefix", [False, True])
def test_grown_batch_hooks_removed_after_error(tiny, pair, readout, monkeypatch, reuse_prefix):
    import mechlingo.analyses.recall.patching as patching

    src, tgt = pair
    kw = dict(readout=readout, batching="grow", reuse_prefix=reuse_prefix)

    class Boom(Exception):
        pass

    def exploding_brancher(rows):
        def hook(t, hook):
            if hook.name.startswith("blocks.1."):
                raise Boom  # mid-pass, after layer 0's hooks have fired
            return torch.cat([t, t[rows]])

        return hook

    monkeypatch.setattr(patching, "_brancher", exploding_brancher)
    with pytest.raises(Boom):
        patch_activations(tiny, src, tgt, ["resid_pre", "head"], **kw)
    assert count_hooks(tiny) == 0

    def mismatched_brancher(rows):
        # a model whose masks do not broadcast fails inside the pass with a RuntimeError
        def hook(t, hook):
            return torch.cat([t, t[rows, :-1]])

        return hook

    monkeypatch.setattr(patching, "_brancher", mismatched_brancher)
    with pytest.raises(PatchingError, match="batching='stack'"):
        patch_activations(tiny, src, tgt, "resid_pre", **kw)
    assert count_hooks(tiny) == 0
    with pytest.raises(PatchingError, match="batching"):
        patch_activations(tiny, src, tgt, readout=readout, batching="tiles")


@pytest.mark.parametrize(
    "site,fn",
    [
        ("resid_pre", tlp.get_act_patch_resid_pre),
        ("attn_out", tlp.get_act_patch_attn_out),
        ("mlp_out", tlp.get_act_patch_mlp_out),
        ("head", tlp.get_act_patch_attn_head_out_by_pos),
    ],
)
def test_equals_transformer_lens(tiny, pair, readout, site, fn):
    src, tgt = pair
    sw = patch_activations(tiny, src, tgt, site, readout=readout, cells_per_batch=13)
    _, cache = tiny.run_with_cache(src.tokens)
    ref = fn(tiny, tgt.tokens, cache, _tl_metric(readout), reduce="none").values
    ours = sw.values[0]
    assert ours.shape[0] == ref.reshape(-1, ref.shape[-1]).shape[0]
    assert (ours - ref.reshape(-1, ref.shape[-1])).abs().max() < 1e-5
    assert count_hooks(tiny) == 0


def test_result_tables_and_figure(tiny, pair, readout):
    src, tgt = pair
    diff = logit_diff(tiny, ["mat", "the"], ["dog", "cat"], name="diff")
    sw = patch_activations(
        tiny, src, tgt, ["resid_pre", "head"], layers=[0], readout=[readout, diff]
    )
    df = sw.to_dataframe()
    assert set(df["readout"]) == {"lp", "diff"}
    assert {"normalized", "ci_low", "ci_high"} <= set(df.columns)
    assert len(sw.to_dataframe(per_example=True)) == 2 * len(sw.cells) * 2
    g = sw.grid("resid_pre")
    assert g.shape == (1, len(sw.position_labels))
    assert sw.grid("head").shape == (1, len(sw.position_labels), tiny.cfg.n_heads)
    lo, hi = sw.bootstrap_ci()
    assert bool(((lo <= hi) | lo.isnan()).all())
    sw.fig_heatmap()
    sw.summary()


def test_subject_span_without_offsets_equals_offsets(tiny, monkeypatch):
    # a tokenizer without character offsets (a "slow" one) falls back to counting the
    # tokens of prompt prefixes; on whole-word subjects both give the same span
    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=3)
    fast = [subject_token_span(tiny, f.prompt, f.subject_span) for f in facts]
    monkeypatch.setattr(type(tiny.tokenizer), "is_fast", property(lambda self: False))
    slow = [subject_token_span(tiny, f.prompt, f.subject_span) for f in facts]
    assert slow == fast


def test_cross_language_alignment(tiny):
    en = load_facts(langs=["en"], relations=["capital"], limit=3)
    fr = load_facts(langs=["fr"], relations=["capital"], limit=3)
    readouts = fact_readouts(tiny, fr)
    with pytest.raises(PatchingError, match="alignment"):
        patch_activations(tiny, en, fr, "resid_pre", readout=readouts)
    sw = patch_activations(
        tiny, en, fr, "resid_pre", readout=readouts, alignment="last", positions=[-1, -2]
    )
    tb, sb = encode(tiny, [f.prompt for f in fr]), encode(tiny, [f.prompt for f in en])
    assert torch.equal(sw.target_positions[0], tb.last_index)
    assert torch.equal(sw.source_positions[1], sb.last_index - 1)
    sw = patch_activations(tiny, en, fr, ["mlp_out"], readout=readouts, alignment="subject")
    assert sw.position_labels == ["subject_first", "subject_last", "-1"]
    for i, (e, f) in enumerate(zip(en, fr, strict=True)):
        assert tuple(sw.source_positions[:2, i].tolist()) == subject_token_span(
            tiny, e.prompt, e.subject_span
        )
        assert tuple(sw.target_positions[:2, i].tolist()) == subject_token_span(
            tiny, f.prompt, f.subject_span
        )
    sw = patch_activations(tiny, en, fr, "resid_pre", readout=readouts, alignment={3: 2, -1: -1})
    assert sw.target_positions[0].tolist() == [3, 3, 3]
    assert sw.source_positions[0].tolist() == [2, 2, 2]


def test_bad_input(tiny, pair, readout):
    src, tgt = pair
    with pytest.raises(PatchingError, match="rows"):
        patch_activations(tiny, src, tgt.select([0]), readout=readout)
    with pytest.raises(PatchingError, match="out of range"):
        patch_activations(tiny, src, tgt, positions=[99], readout=readout)
    with pytest.raises(PatchingError, match="out of range"):
        patch_activations(tiny, src, tgt, positions=[-99], readout=readout)
    with pytest.raises(PatchingError, match="unknown patching site"):
        patch_activations(tiny, src, tgt, "resid_pree", readout=readout)
    with pytest.raises(PatchingError, match="subject"):
        patch_activations(tiny, src, tgt, positions=["subject_last"], readout=readout)
    with pytest.raises(PatchingError, match="empty"):
        subject_token_span(tiny, "The capital of", (4, 4))
    with pytest.raises(PatchingError, match="subject token span"):
        patch_activations(tiny, src, tgt, readout=readout, target_subject=[(3, 1), (1, 2)])
    with pytest.raises(PatchingError, match="examples"):
        patch_activations(tiny, src, tgt, readout=answer_logprob(tiny, ["a", "b", "c"]))
    assert count_hooks(tiny) == 0


def test_knockout(tiny):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=2)
    n = tiny.cfg.n_layers
    res = attention_knockout(tiny, facts, [(0, -1), (0, n - 1), (1, 1)])
    assert torch.allclose(res.values[0], res.base, atol=1e-6)
    assert not torch.allclose(res.values[1], res.base)
    df = res.to_dataframe()
    assert len(df) == 3 and abs(df["relative_change"][0]) < 1e-5
    res.fig_knockout()
    assert not hasattr(res, "fig")  # the one figure name is fig_knockout
    single = attention_knockout(tiny, facts, [(1, 1)])
    assert torch.allclose(single.values[0], res.values[2], atol=1e-5)
    with pytest.raises(PatchingError, match="out of range"):
        attention_knockout(tiny, facts, [(0, n + 3)])
    with pytest.raises(PatchingError, match="subject"):
        attention_knockout(tiny, ["a b c"], [(0, 0)], readout=answer_logprob(tiny, ["x"]))
    assert count_hooks(tiny) == 0


@pytest.mark.slow
def test_gemma_matches_transformer_lens(gemma):
    src, tgt = corrupted_pair(
        gemma, ("The capital of Italy is the city of", "The capital of Spain is the")
    )
    met = answer_logprob(gemma, ["Rome", "Madrid"])
    layers = [0, 8, 17]
    sw = patch_activations(
        gemma, src, tgt, "resid_pre", layers=layers, positions=[1, 2, 3], readout=met
    )
    _, cache = gemma.run_with_cache(src.tokens, names_filter=lambda n: n.endswith("resid_pre"))
    import pandas as pd

    index = pd.DataFrame([(la, p) for la in layers for p in [1, 2, 3]], columns=["layer", "pos"])
    ref = tlp.generic_activation_patch(
        gemma,
        tgt.tokens,
        cache,
        _tl_metric(met),
        tlp.layer_pos_patch_setter,
        "resid_pre",
        index_df=index,
        reduce="none",
    ).values
    # float32 log-probabilities near -9 over a 262k vocabulary: batched and one-cell runs
    # differ in summation order (and with the thread count) by ~1e-4
    torch.testing.assert_close(sw.values[0], ref.to(sw.values.dtype), atol=1e-4, rtol=1e-4)
