"""Peer comparison: mechlingo's EAP and EAP-IG edge scores against auto-circuit's, on one
model, the same prompts and the same clean/corrupted pairs.

Runs in auto-circuit's own environment (``bash scripts/build_peer_envs.sh autocircuit``:
auto-circuit 1.0.1 needs the classic ``HookedTransformer``, which TransformerLens 4 removed;
mechlingo is installed there too, so both sides run in one process on one model)::

    nice -n 5 env OMP_NUM_THREADS=1 .venv-autocircuit/bin/python benchmarks/peer_autocircuit.py

The model: a GPT-2-style ``HookedTransformer`` built from its config with seeded random
weights (no model hub offline; GPT-2 small cannot be downloaded), with the tokenizer of
mechlingo's tiny GPT-2 family, saved once and loaded into two instances (auto-circuit wraps
its instance's modules in place). The prompts: the bundled English ``capital`` facts of the
most common token length, each paired with the next one of another answer (the corrupted
prompt); the metric on both sides: the log-probability of the clean answer's first token at
the last position (auto-circuit: ``grad_function="logprob"``, ``answer_function="avg_val"``).

The two graphs: auto-circuit's receivers are each head's input (``hook_attn_in``,
``separate_qkv=False``), each MLP's input and the final residual; mechlingo's are each
attention layer's input, each MLP's input and the logits. A head-input edge of auto-circuit
is summed over the heads of its layer to give mechlingo's edge (the gradient at a layer's
input is the sum of its heads' input gradients), so both score the same 184 edges here
(senders: the embeddings, 16 heads, 4 MLPs; edges summed over positions).

What differs by design: mechlingo's EAP-IG interpolates the input embeddings from clean to
corrupted (Hanna et al. 2024; a left Riemann sum of ``steps`` points), auto-circuit's
interpolates every edge's mask together (``integrated_grad_samples=steps``: ``steps + 1``
points, both ends included). EAP (one gradient at the clean run) is the same quantity in
both, so its scores must agree to float precision: the first check. Printed: Spearman's rho
over the matching edges (signed scores, and absolute ones: both tools rank by absolute
value), the faithfulness of each tool's top circuits measured by each tool's own patching
at the same fractions of its graph, and the scoring times (CPU clock, best of
``--repeats``). Last line: ``mechlingo eap-ig vs auto-circuit: N.Nx`` (auto-circuit's time
over mechlingo's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)


def build_models(seed: int):
    """Two instances of one seeded GPT-2-style HookedTransformer (mechlingo's, auto-circuit's
    with the hooks it needs), the second loaded from the first's saved weights."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    from mechlingo.testing import build_tiny_folder

    folder = build_tiny_folder(Path(tempfile.mkdtemp(prefix="peer-ac-")) / "gpt2", "gpt2")
    tok = AutoTokenizer.from_pretrained(str(folder))
    kw = {"n_layers": 4, "d_model": 64, "n_ctx": 128, "d_head": 16, "n_heads": 4,
          "d_mlp": 256, "d_vocab": len(tok), "act_fn": "gelu_new",
          "normalization_type": "LN", "seed": seed}  # fmt: skip
    torch.manual_seed(seed)
    ours = HookedTransformer(HookedTransformerConfig(**kw), tokenizer=tok)
    for p in ours.parameters():  # a random init with non-trivial biases and norms
        torch.nn.init.normal_(p, std=0.2 if p.ndim > 1 else 0.1)
    weights = folder.parent / "weights.pt"
    torch.save(ours.state_dict(), weights)
    cfg = HookedTransformerConfig(**kw, use_attn_result=True, use_attn_in=True,
                                  use_hook_mlp_in=True)  # fmt: skip
    theirs = HookedTransformer(cfg, tokenizer=tok)
    theirs.load_state_dict(torch.load(weights))
    for m in (ours, theirs):
        m.eval()
        m.requires_grad_(False)
    return ours, theirs


def make_pairs(model, n: int):
    """``(clean tokens, corrupted tokens, answer ids, prompts)``: English capital facts of
    the most common token length, each with the next fact of another answer."""
    from collections import Counter

    from mechlingo.data import load_facts

    facts = load_facts(langs=["en"], relations=["capital"])
    lengths = [int(model.to_tokens(f.prompt).shape[1]) for f in facts]
    common = Counter(lengths).most_common(1)[0][0]
    same = [f for f, k in zip(facts, lengths, strict=True) if k == common]
    clean, corrupt = [], []
    for i, f in enumerate(same):
        g = next((g for g in same[i + 1 :] + same[:i] if g.answer != f.answer), None)
        if g is not None:
            clean.append(f)
            corrupt.append(g)
        if len(clean) == n:
            break
    ans = torch.tensor([int(model.to_tokens(" " + f.answer, prepend_bos=False)[0, 0])
                        for f in clean])  # fmt: skip
    c = torch.cat([model.to_tokens(f.prompt) for f in clean])
    x = torch.cat([model.to_tokens(f.prompt) for f in corrupt])
    return c, x, ans, [(f.prompt, g.prompt) for f, g in zip(clean, corrupt, strict=True)]


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return out, best


class Ours:
    """mechlingo's side: the graph, the scores, exact patching for faithfulness."""

    def __init__(self, model, clean, corrupt, ans):
        from mechlingo.analyses.circuits import EdgePatcher, build_graph
        from mechlingo.core.tokens import pad_rows

        self.model, self.graph, self.ans = model, build_graph(model), ans
        self.clean = pad_rows(list(clean), pad_id=0, has_bos=True)
        self.corrupt = pad_rows(list(corrupt), pad_id=0, has_bos=True)
        self.roles = torch.ones(clean.shape[0], clean.shape[1], 1)
        self.patcher = EdgePatcher(model, self.graph, self.clean, self.corrupt, self.readout,
                                   self.roles, batch_size=clean.shape[0])  # fmt: skip

    def readout(self, final, rows):
        logits = self.model.unembed(self.model.ln_final(final[:, None, :]))[:, 0]
        return logits.log_softmax(-1).gather(1, self.ans[rows.cpu()][:, None])[:, 0]

    def scores(self, steps: int):
        from mechlingo.analyses.circuits import edge_scores

        s, _, _ = edge_scores(self.model, self.graph, self.clean, self.corrupt, self.readout,
                              self.roles, steps=steps, batch_size=self.clean.batch_size)  # fmt: skip
        g = self.graph
        mean = s.mean(0)[:, :, 0]
        return {(g.senders[a].name, g.receivers[b].name): float(mean[a, b])
                for a, b in g.mask.nonzero().tolist()}  # fmt: skip

    def faithfulness(self, scores, fractions):
        """Faithfulness (ratio of means) of the top edges by |score| at each fraction."""
        g = self.graph
        index = {(s.name, r.name): (i, j) for i, s in enumerate(g.senders)
                 for j, r in enumerate(g.receivers)}  # fmt: skip
        order = sorted(scores, key=lambda e: -abs(scores[e]))
        every = torch.zeros_like(g.mask)
        clean = self.patcher.metric(every[:, :, None]).mean()
        corr = self.patcher.metric(g.mask[:, :, None]).mean()
        out = {}
        for f in fractions:
            keep = order[: max(1, round(f * len(order)))]
            removed = g.mask.clone()
            for e in keep:
                removed[index[e]] = False
            m = self.patcher.metric(removed[:, :, None]).mean()
            out[f] = (len(keep), float((m - corr) / (clean - corr)))
        return out


class Theirs:
    """auto-circuit's side: the patchable model, its mask-gradient scores, its patching."""

    def __init__(self, model, clean, corrupt, ans):
        from auto_circuit.data import PromptDataLoader, PromptDataset
        from auto_circuit.utils.graph_utils import patchable_model

        self.model = patchable_model(model, factorized=True, slice_output="last_seq",
                                     separate_qkv=False, device=torch.device("cpu"))  # fmt: skip
        ds = PromptDataset(clean, corrupt, [a[None] for a in ans], [a[None] for a in ans])
        self.loader = PromptDataLoader(ds, seq_len=None, diverge_idx=0,
                                       batch_size=clean.shape[0], shuffle=False)  # fmt: skip
        self.ans = ans

    def scores(self, steps: int):
        """Per auto-circuit edge; ``steps=1``: EAP (``mask_val=0``), else
        ``integrated_grad_samples=steps``."""
        from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores

        kw = {"mask_val": 0.0} if steps == 1 else {"integrated_grad_samples": steps}
        ps = mask_gradient_prune_scores(self.model, self.loader, None, grad_function="logprob",
                                        answer_function="avg_val", **kw)  # fmt: skip
        return ps, {e: float(e.prune_score(ps)) for e in self.model.edges}

    def faithfulness(self, ps, fractions):
        from auto_circuit.prune import run_circuits
        from auto_circuit.types import PatchType

        n = len(self.model.edges)
        sizes = sorted({0, n, *[max(1, round(f * n)) for f in fractions]})
        outs = run_circuits(self.model, self.loader, sizes, ps, patch_type=PatchType.TREE_PATCH)

        def metric(k):
            logits = next(iter(outs[k].values()))
            return float(logits.log_softmax(-1).gather(1, self.ans[:, None]).mean())

        clean, corr = metric(n), metric(0)
        return {f: (max(1, round(f * n)), (metric(max(1, round(f * n))) - corr) / (clean - corr))
                for f in fractions}  # fmt: skip


def to_ours(edge) -> tuple[str, str]:
    """auto-circuit's edge as mechlingo's (sender, receiver) names."""
    src, dest = edge.src.name, edge.dest.name
    s = (
        "embed"
        if src == "Resid Start"
        else (f"m{src[4:]}" if src.startswith("MLP") else "a{}.h{}".format(*src[1:].split(".")))
    )
    if dest == "Resid End":
        r = "logits"
    elif dest.startswith("MLP"):
        r = f"mlp{dest[4:]}"
    else:
        r = f"attn{dest[1:].split('.')[0]}"
    return s, r


def compare(ours: dict, theirs: dict, scale: float) -> tuple[float, float, float, int]:
    """Spearman (signed, absolute) over matching edges, the largest difference relative to
    the largest score, and the number of edges; ``theirs`` summed per mechlingo edge and
    scaled by ``scale``."""
    from scipy.stats import spearmanr

    summed: dict[tuple[str, str], float] = {}
    for e, v in theirs.items():
        k = to_ours(e)
        summed[k] = summed.get(k, 0.0) + v * scale
    keys = sorted(set(ours) & set(summed))
    missing = (set(ours) | set(summed)) - set(keys)
    assert not missing, f"edges without a match: {sorted(missing)[:5]}"
    a, b = [ours[k] for k in keys], [summed[k] for k in keys]
    gap = max(abs(x - y) for x, y in zip(a, b, strict=True)) / max(abs(x) for x in a)
    rho = float(spearmanr(a, b).statistic)
    rho_abs = float(spearmanr([abs(x) for x in a], [abs(x) for x in b]).statistic)
    return rho, rho_abs, gap, len(keys)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=16, help="clean/corrupted pairs (default 16)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG steps (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timing: best of N (default 3)")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    import auto_circuit  # noqa: F401  (fails here, with its own error, outside its environment)

    m_ours, m_theirs = build_models(args.seed)
    clean, corrupt, ans, prompts = make_pairs(m_ours, args.pairs)
    n = clean.shape[0]
    print(f"model: GPT-2-style HookedTransformer, 4 layers x 4 heads, d_model 64, random "
          f"(seed {args.seed}); {n} English capital pairs of {clean.shape[1]} tokens, e.g. "
          f"{prompts[0][0]!r} / {prompts[0][1]!r}; torch threads {torch.get_num_threads()}")  # fmt: skip
    ours, theirs = Ours(m_ours, clean, corrupt, ans), Theirs(m_theirs, clean, corrupt, ans)
    print(f"edges: mechlingo {int(ours.graph.mask.sum())}, auto-circuit "
          f"{len(theirs.model.edges)} (head inputs summed per layer to match)")  # fmt: skip
    with torch.enable_grad():
        eap_o = ours.scores(1)
        _, eap_t = theirs.scores(1)
        (ig_o, t_o) = timed(lambda: ours.scores(args.steps), args.repeats)
        ((ps_t, ig_t), t_t) = timed(lambda: theirs.scores(args.steps), args.repeats)
    rho, rho_abs, gap, k = compare(eap_o, eap_t, -1.0)
    print(
        f"EAP (the same quantity on both sides): Spearman {rho:.4f} (|score| {rho_abs:.4f}) "
        f"over {k} edges, largest difference {gap:.1e} of the largest score"
    )
    rho, rho_abs, gap, k = compare(ig_o, ig_t, -1.0 / (args.steps + 1))
    print(f"EAP-IG, {args.steps} steps (embeddings vs edge masks interpolated): Spearman "
          f"{rho:.3f} (|score| {rho_abs:.3f}) over {k} edges")  # fmt: skip
    print(
        "faithfulness of the top edges (ratio of means over the pairs, each tool's own "
        "patching of everything outside the circuit):"
    )
    f_o = ours.faithfulness(ig_o, FRACTIONS)
    f_t = theirs.faithfulness(ps_t, FRACTIONS)
    for f in FRACTIONS:
        print(f"  top {f:.0%}: mechlingo {f_o[f][1]:.3f} ({f_o[f][0]} edges), auto-circuit "
              f"{f_t[f][1]:.3f} ({f_t[f][0]} edges)")  # fmt: skip
    print(f"EAP-IG scoring time (CPU s, best of {args.repeats}): mechlingo {t_o:.3f}, "
          f"auto-circuit {t_t:.3f}")  # fmt: skip
    print()
    print(f"mechlingo eap-ig vs auto-circuit: {t_t / t_o:.1f}x")


if __name__ == "__main__":
    main()
