"""Attribution patching: first-order equality with exact patching, the QK fix, neurons,
hooks and gradients (tiny model; two gemma checks)."""

from __future__ import annotations

import pytest
import torch

from mechlingo.analyses.recall.attribution import (
    attribution_patch,
    compare_patching,
    neuron_attribution,
    verify_top_cells,
)
from mechlingo.analyses.recall.patching import (
    PatchingError,
    answer_logprob,
    fact_readouts,
    patch_activations,
)
from mechlingo.core.sites import resolve_site
from mechlingo.data import load_facts
from tests.conftest import corrupted_pair, count_hooks

SITES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "head"]


class _Stop(Exception):
    pass


def _reference_metric(model, tokens, ids, hooks=(), early=False):
    """Plain TransformerLens: log mass of each row's answer ids after the last token
    (``early``: stop at the final residual stream and unembed the last position only)."""
    if early:
        got = {}

        def grab(t, hook):
            got["x"] = t[:, -1]
            raise _Stop

        name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
        try:
            model.run_with_hooks(tokens, fwd_hooks=[*hooks, (name, grab)])
        except _Stop:
            pass
        logits = model.ln_final(got["x"][:, None])[:, 0] @ model.W_U + model.b_U
    else:
        logits = model.run_with_hooks(tokens, fwd_hooks=list(hooks))[:, -1]
    lp = logits.double().log_softmax(-1)
    return torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(len(ids))])


def _exact_interpolated(model, src, tgt, sweep, readout, eps, early=False):
    """Reference, independent of mechlingo's patching code: for every cell of ``sweep``, run
    the target with the activation at that cell moved to ``target + eps (source - target)``
    (TransformerLens caches and hooks) and read the readout; ``[cell, example]``. The cells
    run as the rows of one batch (cell ``r``, example ``b`` is row ``r * B + b``): rows do not
    interact, and each hook moves only its own cells' rows."""
    ids = [list(s[0].ids) for s in readout.sets]
    names = {(c.site, c.layer) for c in sweep.cells}
    hook = {
        k: resolve_site(model, "attn_z" if k[0] == "head" else k[0], k[1]).hook_name for k in names
    }
    want = set(hook.values())
    _, s_cache = model.run_with_cache(src.tokens, names_filter=lambda n: n in want)
    _, t_cache = model.run_with_cache(tgt.tokens, names_filter=lambda n: n in want)
    n_ex = tgt.tokens.shape[0]
    moves: dict[str, list] = {}
    for r, c in enumerate(sweep.cells):
        name = hook[(c.site, c.layer)]
        p = int(sweep.target_positions[c.position, 0])  # same-shape pair: one position
        s, t = s_cache[name][:, p], t_cache[name][:, p]
        rows = slice(r * n_ex, (r + 1) * n_ex)
        if c.site == "resid_mid":
            # resid_mid is the residual between attention and MLP: on the bridge its hook is
            # only the MLP's input, so the reference moves the residual through attn_out
            # instead (the MLP sees the move too)
            at = resolve_site(model, "attn_out", c.layer).hook_name
            moves.setdefault(at, []).append(("add", rows, p, eps * (s - t), -1))
        else:
            moves.setdefault(name, []).append(("set", rows, p, t + eps * (s - t), c.head))

    def mover(todo):
        def move(act, hook):
            act = act.clone()
            for kind, rows, p, value, h in todo:
                if kind == "add":
                    act[rows, p] += value
                elif h >= 0:
                    act[rows, p, h] = value[:, h]
                else:
                    act[rows, p] = value
            return act

        return move

    hooks = [(name, mover(todo)) for name, todo in moves.items()]
    n_cells = len(sweep.cells)
    tokens = tgt.tokens.repeat(n_cells, 1)
    got = _reference_metric(model, tokens, ids * n_cells, hooks, early=early)
    return got.view(n_cells, n_ex)


@pytest.fixture(scope="module")
def pair(tiny):
    return corrupted_pair(tiny)


@pytest.fixture(scope="module")
def readout(tiny):
    return answer_logprob(tiny, ["mat", "the"], name="lp")


@pytest.mark.parametrize("qk_fix", [False, True])
def test_first_order_equals_exact_patching(tiny, pair, readout, qk_fix):
    # a tiny interpolation towards the source: AtP must give the exact effect up to O(eps^2);
    # central differences of the exact patch remove the eps^2 term of the reference too
    src, tgt = pair
    eps = 1e-2
    kw = dict(readout=readout, positions=[1, 2, 4, -1], qk_fix=qk_fix)  # token 2 is corrupted
    sites = SITES if not qk_fix else ["resid_pre", "mlp_out"]
    at = attribution_patch(tiny, src, tgt, sites, **kw)
    plus = _exact_interpolated(tiny, src, tgt, at, readout, eps)
    minus = _exact_interpolated(tiny, src, tgt, at, readout, -eps)
    slope = (plus - minus) / (2 * eps)  # d readout / d eps at eps = 0, per cell and example
    scale = float(slope.abs().max())
    assert scale > 1e-3
    if not qk_fix:  # plain AtP is linear: at scale 1 it is the slope itself
        est = (at.values[0] - at.corrupted[0]).double()
        assert (est - slope).abs().max() < 2e-3 * scale + 1e-5
    # a small patch (with the QK fix: the exact pattern change plus the linear rest)
    small = attribution_patch(tiny, src, tgt, sites, scale=eps, **kw)
    base = _reference_metric(tiny, tgt.tokens, [list(s[0].ids) for s in readout.sets])
    diff = (small.values[0] - small.corrupted[0]).double() - (plus - base)
    assert diff.abs().max() < 1e-2 * eps * scale + 1e-6  # second-order remainder only
    assert count_hooks(tiny) == 0


def test_baselines_and_result_type_match_exact(tiny, pair, readout):
    src, tgt = pair
    at = attribution_patch(tiny, src, tgt, SITES, readout=readout)
    ex = patch_activations(tiny, src, tgt, SITES, readout=readout)
    assert at.cells == ex.cells and at.position_labels == ex.position_labels
    assert torch.allclose(at.clean, ex.clean, atol=1e-5)
    assert torch.allclose(at.corrupted, ex.corrupted, atol=1e-5)
    assert at.meta["method"] == "atp*" and at.meta["qk_fix"]
    # the same figures and tables work
    at.fig_heatmap()
    assert at.grid("head").shape == ex.grid("head").shape
    assert len(at.to_dataframe()) == len(ex.to_dataframe())
    # source == target: every estimate is zero
    same = attribution_patch(tiny, src, src, SITES, readout=readout)
    assert torch.allclose(same.values, same.corrupted[:, None, :].expand_as(same.values))


def test_qk_fix_only_changes_resid_pre(tiny, pair, readout):
    src, tgt = pair
    a = attribution_patch(tiny, src, tgt, SITES, readout=readout, qk_fix=False)
    b = attribution_patch(tiny, src, tgt, SITES, readout=readout, qk_fix=True)
    pre = torch.tensor([c.site == "resid_pre" for c in a.cells])
    assert torch.equal(a.values[:, ~pre], b.values[:, ~pre])
    assert not torch.allclose(a.values[:, pre], b.values[:, pre])
    # a cell at the last position of the last layer's resid_pre feeds its own attention:
    # with the pattern change computed exactly the estimate is closer to exact patching
    ex = patch_activations(tiny, src, tgt, "resid_pre", readout=readout)
    err_a = (a.values[:, pre] - ex.values).abs().mean()
    err_b = (b.values[:, pre] - ex.values).abs().mean()
    assert err_b < err_a


def test_cross_language_alignment_same_cells_as_patch_activations(tiny):
    en = load_facts(langs=["en"], relations=["capital"], limit=3)
    ja = load_facts(langs=["ja"], relations=["capital"], limit=3)
    readouts = fact_readouts(tiny, ja)
    kw = dict(readout=readouts, alignment="subject")
    at = attribution_patch(tiny, en, ja, ["resid_pre", "mlp_out", "head"], **kw)
    ex = patch_activations(tiny, en, ja, ["resid_pre", "mlp_out", "head"], **kw)
    assert at.cells == ex.cells
    assert torch.equal(at.target_positions, ex.target_positions)
    assert torch.equal(at.source_positions, ex.source_positions)
    assert at.readout_names == ["answer_logprob", "en_logprob"]
    assert torch.allclose(at.corrupted, ex.corrupted, atol=1e-4)
    cmp = compare_patching(at, ex)
    assert set(cmp) == {"resid_pre", "mlp_out", "head", "all"}
    assert cmp["head"]["n_cells"] == 3 * tiny.cfg.n_layers * tiny.cfg.n_heads
    same = compare_patching(ex, ex, k=5)
    assert all(v["spearman"] == pytest.approx(1.0) and v["top_k"] == 1.0 for v in same.values())


def test_verify_top_cells_are_exact(tiny, pair, readout):
    src, tgt = pair
    at = attribution_patch(tiny, src, tgt, ["head"], readout=readout)
    rows = verify_top_cells(tiny, src, tgt, at, k=3, by=0, readout=readout)
    ex = patch_activations(tiny, src, tgt, "head", readout=readout)
    nrm = ex.normalized()
    for r in rows:
        i = next(
            j
            for j, c in enumerate(ex.cells)
            if c.layer == r["layer"]
            and c.head == r["head"]
            and ex.position_labels[c.position] == r["position"]
        )
        # float32 noise of two batchings, divided by the clean-corrupted gap
        assert r["exact"] == pytest.approx(float(nrm[i]), rel=1e-5, abs=1e-5)
    eff = at.effect().abs()
    assert abs(rows[0]["estimate_effect"]) == pytest.approx(float(eff.max()), rel=1e-6)


def test_neurons_first_order(tiny, pair, readout):
    src, tgt = pair
    na = neuron_attribution(tiny, src, tgt, readout=readout)
    L, P = tiny.cfg.n_layers, len(na.position_labels)
    assert na.values.shape == (1, L, P, tiny.cfg.d_mlp, 2)
    ids = [list(s[0].ids) for s in readout.sets]
    eps = 1e-2
    for r in na.top(3):
        name = resolve_site(tiny, "mlp_post", r["layer"]).hook_name
        p, n = int(r["position"]), r["neuron"]
        _, sc = tiny.run_with_cache(src.tokens, names_filter=[name])
        _, tc = tiny.run_with_cache(tgt.tokens, names_filter=[name])
        d = sc[name][:, p, n] - tc[name][:, p, n]

        def nudge(sign, p=p, n=n, d=d):
            def hook_fn(act, hook):
                act = act.clone()
                act[:, p, n] = act[:, p, n] + sign * eps * d
                return act

            return hook_fn

        plus = _reference_metric(tiny, tgt.tokens, ids, [(name, nudge(1.0))])
        minus = _reference_metric(tiny, tgt.tokens, ids, [(name, nudge(-1.0))])
        slope = ((plus - minus) / (2 * eps)).mean()
        assert r["effect"] == pytest.approx(float(slope), rel=5e-3, abs=1e-6)
    df = na.to_dataframe(k=5)
    assert len(df) == 5 and df["effect"].abs().is_monotonic_decreasing


def test_hooks_removed_and_no_gradient_leak(tiny, pair, readout, monkeypatch):
    import mechlingo.analyses.recall.gradients as gradients

    src, tgt = pair
    assert not torch.is_grad_enabled()
    attribution_patch(tiny, src, tgt, SITES, readout=readout)
    assert not torch.is_grad_enabled()
    assert all(p.grad is None for p in tiny.parameters())
    assert count_hooks(tiny) == 0

    class Boom(Exception):
        pass

    def boom(*a, **k):
        raise Boom

    monkeypatch.setattr(gradients, "_readout_values", boom)
    with pytest.raises(Boom):
        attribution_patch(tiny, src, tgt, SITES, readout=readout)
    assert count_hooks(tiny) == 0 and not torch.is_grad_enabled()
    monkeypatch.undo()
    # an exception raised by a hook in the middle of the gradient pass, after layer 0's
    # hooks have fired
    real = gradients.hooked

    def raiser(t, hook):
        raise Boom

    def hooked_with_raiser(model, hooks):
        return real(model, [*hooks, ("blocks.1.hook_resid_pre", raiser)])

    monkeypatch.setattr(gradients, "hooked", hooked_with_raiser)
    with pytest.raises(Boom):
        attribution_patch(tiny, src, tgt, "resid_pre", readout=readout)
    assert count_hooks(tiny) == 0 and not torch.is_grad_enabled()


def _ig_reference(model, src, tgt, sweep, readout, alphas, eps=1e-2):
    """Hand computation of integrated gradients, independent of mechlingo's code: for each
    ``alpha``, run the target with its embeddings moved to ``target + alpha (source -
    target)`` (a plain TransformerLens hook), nudge the cell's activation by ``+-eps (source
    - target)`` (the uninterpolated activations), and take the central difference; the mean
    over ``alphas``, ``[cell, example]``."""
    ids = [list(s[0].ids) for s in readout.sets]
    names = {(c.site, c.layer) for c in sweep.cells}
    hook = {
        k: resolve_site(model, "attn_z" if k[0] == "head" else k[0], k[1]).hook_name for k in names
    }
    want = set(hook.values()) | {"hook_embed"}
    _, s_cache = model.run_with_cache(src.tokens, names_filter=lambda n: n in want)
    _, t_cache = model.run_with_cache(tgt.tokens, names_filter=lambda n: n in want)
    out = torch.zeros(len(sweep.cells), src.batch_size, dtype=torch.float64)
    for a in alphas:
        d_emb = s_cache["hook_embed"] - t_cache["hook_embed"]

        def interp(act, hook, a=a, d_emb=d_emb):
            return act + a * d_emb

        for i, c in enumerate(sweep.cells):
            name = hook[(c.site, c.layer)]
            p = int(sweep.target_positions[c.position, 0])
            d = s_cache[name][:, p] - t_cache[name][:, p]
            vals = []
            for sign in (1.0, -1.0):

                def nudge(act, hook, p=p, d=d, h=c.head, sign=sign):
                    act = act.clone()
                    if h >= 0:
                        act[:, p, h] = act[:, p, h] + sign * eps * d[:, h]
                    else:
                        act[:, p] = act[:, p] + sign * eps * d
                    return act

                hooks = [("hook_embed", interp), (name, nudge)]
                vals.append(_reference_metric(model, tgt.tokens, ids, hooks))
            out[i] += (vals[0] - vals[1]) / (2 * eps) / len(alphas)
    return out


IG_SITES = ["resid_pre", "resid_post", "attn_out", "mlp_out", "head"]


def test_ig_one_step_is_plain_atp(tiny, pair, readout):
    src, tgt = pair
    atp = attribution_patch(tiny, src, tgt, SITES, readout=readout, qk_fix=False)
    ig = attribution_patch(tiny, src, tgt, SITES, readout=readout, method="ig", steps=1)
    assert torch.equal(atp.values, ig.values) and torch.equal(atp.corrupted, ig.corrupted)
    assert ig.meta["method"] == "ig" and ig.meta["steps"] == 1


@pytest.mark.parametrize("steps", [2, 3])
def test_ig_equals_hand_computation(tiny, pair, readout, steps):
    src, tgt = pair
    kw = dict(readout=readout, positions=[1, 2, -1], layers=[0, 1])
    ig = attribution_patch(tiny, src, tgt, IG_SITES, method="ig", steps=steps, **kw)
    ref = _ig_reference(tiny, src, tgt, ig, readout, [j / steps for j in range(steps)])
    est = (ig.values[0] - ig.corrupted[0]).double()
    scale = float(ref.abs().max())
    assert scale > 1e-3
    assert (est - ref).abs().max() < 2e-3 * scale + 1e-5  # float32 differences, O(eps^2)
    # and it is not plain AtP: the interpolated runs changed the gradients
    atp = attribution_patch(tiny, src, tgt, IG_SITES, qk_fix=False, **kw)
    assert (atp.values - ig.values).abs().max() > 1e-2 * scale
    assert count_hooks(tiny) == 0 and not torch.is_grad_enabled()


def test_ig_converges_to_exact_patching_at_the_input(tiny, pair, readout):
    # the pair differs at token 2 only, so along the input interpolation the residual at
    # layer 0, position 2 moves on the straight line from target to source and nothing else
    # moves: the integral of the gradient is the exact patching effect of that cell
    src, tgt = pair
    kw = dict(readout=readout, positions=[2], layers=[0])
    ex = patch_activations(tiny, src, tgt, "resid_pre", **kw)
    gap = (ex.values - ex.corrupted[:, None]).abs().max()
    errors = []
    for steps in (1, 4, 64):
        ig = attribution_patch(tiny, src, tgt, "resid_pre", method="ig", steps=steps, **kw)
        errors.append(float((ig.values - ex.values).abs().max()))
    assert gap > 1e-2
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.03 * gap  # the left Riemann sum's error falls like 1 / steps


def test_ig_batched_equals_one_by_one(tiny, pair, readout):
    src, tgt = pair
    both = attribution_patch(tiny, src, tgt, IG_SITES, readout=readout, method="ig", steps=3)
    for b in range(src.batch_size):
        one_metric = readout.__class__(readout.name, readout.kind, readout.sets[b : b + 1])
        one = attribution_patch(
            tiny, src.select([b]), tgt.select([b]), IG_SITES, readout=one_metric, method="ig",
            steps=3,
        )  # fmt: skip
        assert torch.allclose(one.values[:, :, 0], both.values[:, :, b], atol=1e-5)


def test_ig_neurons_one_step_is_atp_and_two_differ(tiny, pair, readout):
    src, tgt = pair
    a = neuron_attribution(tiny, src, tgt, readout=readout)
    b = neuron_attribution(tiny, src, tgt, readout=readout, method="ig", steps=1)
    c = neuron_attribution(tiny, src, tgt, readout=readout, method="ig", steps=2)
    assert torch.equal(a.values, b.values)
    assert not torch.allclose(a.values, c.values) and c.meta["steps"] == 2


def test_ig_bad_input_and_hooks_removed(tiny, pair, readout, monkeypatch):
    import mechlingo.analyses.recall.gradients as gradients

    src, tgt = pair
    with pytest.raises(PatchingError, match="method"):
        attribution_patch(tiny, src, tgt, readout=readout, method="eap")
    with pytest.raises(PatchingError, match="steps"):
        attribution_patch(tiny, src, tgt, readout=readout, method="ig", steps=0)
    with pytest.raises(PatchingError, match="QK fix"):
        attribution_patch(tiny, src, tgt, readout=readout, method="ig", qk_fix=True)
    en = load_facts(langs=["en"], relations=["capital"], limit=2)
    ja = load_facts(langs=["ja"], relations=["capital"], limit=2)
    with pytest.raises(PatchingError, match="token length"):
        attribution_patch(
            tiny, en, ja, "mlp_out", readout=fact_readouts(tiny, ja), alignment="subject",
            method="ig",
        )  # fmt: skip

    class Boom(Exception):
        pass

    def boom(*a, **k):
        raise Boom

    monkeypatch.setattr(gradients, "_readout_values", boom)
    with pytest.raises(Boom):
        attribution_patch(tiny, src, tgt, IG_SITES, readout=readout, method="ig", steps=3)
    assert count_hooks(tiny) == 0 and not torch.is_grad_enabled()


def test_bad_input(tiny, pair, readout):
    src, tgt = pair
    with pytest.raises(PatchingError, match="unknown patching site"):
        attribution_patch(tiny, src, tgt, "resid_pree", readout=readout)
    with pytest.raises(PatchingError, match="rows"):
        attribution_patch(tiny, src, tgt.select([0]), readout=readout)
    with pytest.raises(PatchingError, match="alignment"):
        en = load_facts(langs=["en"], relations=["capital"], limit=2)
        fr = load_facts(langs=["fr"], relations=["capital"], limit=2)
        attribution_patch(tiny, en, fr, readout=fact_readouts(tiny, fr))
    with pytest.raises(PatchingError, match="heads"):
        attribution_patch(tiny, src, tgt, "head", readout=readout, heads=[99])
    assert count_hooks(tiny) == 0


@pytest.mark.slow
def test_gemma_first_order(gemma):
    src, tgt = corrupted_pair(
        gemma, ("The capital of Italy is the city of", "The capital of Spain is the")
    )
    met = answer_logprob(gemma, ["Rome", "Madrid"])
    sites = ["resid_pre", "attn_out", "mlp_out", "head"]
    at = attribution_patch(
        gemma, src, tgt, sites, layers=[2, 16], positions=[3, -1], readout=met, qk_fix=False
    )
    eps = 1e-2
    plus = _exact_interpolated(gemma, src, tgt, at, met, eps, early=True)
    minus = _exact_interpolated(gemma, src, tgt, at, met, -eps, early=True)
    slope = (plus - minus) / (2 * eps)
    est = (at.values[0] - at.corrupted[0]).double()
    scale = float(slope.abs().max())
    assert (est - slope).abs().max() < 5e-3 * scale + 1e-4
    assert count_hooks(gemma) == 0


@pytest.mark.slow
def test_gemma_ranks_like_exact_patching(gemma):
    fr = load_facts(langs=["fr"], relations=["capital"], limit=6)
    clean, corrupt = fr[:3], fr[3:6]
    kw = dict(
        positions=["subject_first", "subject_last", -2, -1],
        readout=fact_readouts(gemma, clean),
        alignment="subject",
    )
    sites = ["attn_out", "mlp_out"]
    at = attribution_patch(gemma, clean, corrupt, sites, **kw)
    ex = patch_activations(gemma, clean, corrupt, sites, **kw)
    cmp = compare_patching(at, ex)
    assert cmp["attn_out"]["spearman"] > 0.6 and cmp["mlp_out"]["spearman"] > 0.6, cmp


def test_trace_cli_both_methods(tiny_dir, tmp_path, capsys):
    import json

    from mechlingo.cli import main

    out = tmp_path / "out"
    args = ["trace", "--model", str(tiny_dir), "--langs", "fr", "--limit", "3"]
    args += [
        "--max-new-tokens",
        "2",
        "--patch-prompts",
        "2",
        "--patch-unanswered",
        "--quiet",
        "--out",
        str(out),
    ]
    assert main([*args, "--method", "both", "--verify-heads", "2"]) == 0
    fr = json.loads((out / "patching.json").read_text())["fr"]
    assert fr["method"] == "both"
    assert set(fr["comparison"]) == {"attn_out", "mlp_out", "head", "all"}
    assert -1 <= fr["comparison"]["attn_out"]["spearman"] <= 1
    assert len(fr["verified_heads"]) == 2 and {"estimate", "exact"} <= set(fr["verified_heads"][0])
    assert {c["site"] for c in fr["atp_cells"]} == {"attn_out", "mlp_out", "head"}
    assert {c["site"] for c in fr["cells"]} == {"attn_out", "mlp_out", "head"}
    html = (out / "report.html").read_text()
    assert "AtP vs exact patching (fr)" in html and "verified exactly" in html
    assert "fr AtP vs exact, attn_out: spearman" in capsys.readouterr().out
    assert main([*args, "--method", "atp", "--out", str(tmp_path / "atp")]) == 0
    fr = json.loads((tmp_path / "atp" / "patching.json").read_text())["fr"]
    assert fr["sweep"]["method"] == "atp" and "comparison" not in fr  # no resid_pre: plain AtP
