"""Peer comparison: mechlingo's EAP and EAP-IG edge scores against auto-circuit's, on one
model, the same prompts and the same clean/corrupted pairs.

auto-circuit 1.0.1 needs the classic ``HookedTransformer``, which TransformerLens 4 removed,
and mechlingo's circuits need a TransformerLens 4 bridge, so each side runs in its own
environment: this script in mechlingo's (the driver), and again in auto-circuit's
(``bash scripts/build_peer_envs.sh autocircuit``, ``.venv-autocircuit``, or ``--peer`` /
``$PEER_AUTOCIRCUIT``) with ``--side theirs``::

    nice -n 5 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer_autocircuit.py

The model (no model hub offline, so no GPT-2 small): mechlingo's tiny GPT-2 family
(``build_tiny_folder``) at 4 layers, 4 heads, d_model 64, its weights redrawn from a seeded
normal (``--std``, default 0.6, so the random model's outputs are not flat) and saved as a transformers
folder; mechlingo loads it with ``load_model`` (the bridge), auto-circuit's side builds a
``HookedTransformer`` from the same folder with TransformerLens 3's GPT-2 weight conversion
(no weight processing). Both sides' clean readouts are printed (they must agree). The prompts:
the bundled English ``capital`` facts of the most common token length, each paired with the
next one of another answer (the corrupted prompt); the tokens are made once, by the driver,
and passed to both. The readout on both sides: the log-probability of the clean answer's first
token at the last position (auto-circuit: ``grad_function="logprob"``,
``answer_function="avg_val"``).

The two graphs: auto-circuit's receivers are each head's input (``hook_attn_in``,
``separate_qkv=False``), each MLP's input and the final residual; mechlingo's are each
attention layer's input, each MLP's input and the logits. A head-input edge of auto-circuit
is summed over the heads of its layer to give mechlingo's edge (the gradient at a layer's
input is the sum of its heads' input gradients); edges are summed over positions.

What differs by design: mechlingo's EAP-IG interpolates the input embeddings from clean to
corrupted (Hanna et al. 2024; a left Riemann sum of ``steps`` points), auto-circuit's
interpolates every edge's mask together (``integrated_grad_samples=steps``: ``steps + 1``
points, both ends). EAP (one gradient in the clean run) is the same quantity in both, so its
scores must agree to float precision: the first check. Printed: Spearman's rho over the
matching edges (signed scores, and absolute ones: both tools rank by absolute value), the
faithfulness of each tool's top circuits at the same fractions of its graph, each measured by
its own patching of every edge outside the circuit, and the scoring times (CPU clock, best of
``--repeats``). Last line: ``mechlingo eap-ig vs auto-circuit: N.Nx`` (auto-circuit's time
over mechlingo's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from smoke import cpu_timed

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)


# ------------------------------------------------------------------ auto-circuit's side


def hooked_from_folder(folder: str):
    """The GPT-2 folder as a TransformerLens 3 ``HookedTransformer`` with the hooks
    auto-circuit needs (weights converted, not processed)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder)
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, n_heads=c.n_head,
        d_head=c.n_embd // c.n_head, d_mlp=4 * c.n_embd, d_vocab=c.vocab_size,
        act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        use_attn_result=True, use_attn_in=True, use_hook_mlp_in=True,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
        center_unembed=False, fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    model.eval()
    model.requires_grad_(False)
    return model


def run_theirs(job: dict) -> dict:
    """auto-circuit's scores (EAP, EAP-IG), faithfulness and time on the job's pairs."""
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune import run_circuits
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.types import PatchType
    from auto_circuit.utils.graph_utils import patchable_model

    torch.set_grad_enabled(False)
    clean, corrupt, ans = job["clean"], job["corrupt"], job["ans"]
    model = patchable_model(hooked_from_folder(job["folder"]), factorized=True,
                            slice_output="last_seq", separate_qkv=False,
                            device=torch.device("cpu"))  # fmt: skip
    ds = PromptDataset(clean, corrupt, [a[None] for a in ans], [a[None] for a in ans])
    loader = PromptDataLoader(ds, seq_len=None, diverge_idx=0, batch_size=clean.shape[0],
                              shuffle=False)  # fmt: skip

    def scores(steps: int):
        kw = {"mask_val": 0.0} if steps == 1 else {"integrated_grad_samples": steps}
        with torch.enable_grad():
            ps = mask_gradient_prune_scores(model, loader, None, grad_function="logprob",
                                            answer_function="avg_val", **kw)  # fmt: skip
        return ps, {e.name: float(e.prune_score(ps)) for e in model.edges}

    _, eap = scores(1)
    (ps, ig), t = cpu_timed(lambda: scores(job["steps"]), job["repeats"])
    n = len(model.edges)
    size = {f: max(1, round(f * n)) for f in job["fractions"]}
    outs = run_circuits(model, loader, sorted({0, n, *size.values()}), ps,
                        patch_type=PatchType.TREE_PATCH)  # fmt: skip

    def metric(k: int) -> torch.Tensor:  # per pair
        logits = next(iter(outs[k].values()))
        return logits.log_softmax(-1).gather(1, ans[:, None])[:, 0]

    rows = {k: metric(k) for k in {0, n, *size.values()}}
    return {"eap": eap, "ig": ig, "seconds": t, "n_edges": n, "rows": rows, "size": size,
            "clean": float(rows[n].mean()), "corrupt": float(rows[0].mean())}  # fmt: skip


# ------------------------------------------------------------------ mechlingo's side


def build_folder(seed: int, std: float) -> Path:
    """The tiny GPT-2 folder with its weights redrawn from a seeded normal (``std``; biases
    and norms half of it)."""
    from transformers import AutoModelForCausalLM

    from mechlingo.testing import build_tiny_folder

    folder = build_tiny_folder(Path(tempfile.mkdtemp(prefix="peer-ac-")) / "gpt2", "gpt2",
                               n_layers=4, d_model=64, n_heads=4)  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(str(folder))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (std if p.ndim > 1 else std / 2))
    hf.save_pretrained(str(folder))
    return folder


def make_pairs(model, n: int):
    """``(clean, corrupted TokenBatch, answer ids, prompts, candidate pairs)``: English capital facts of the
    most common token length, each with the next fact of another answer; of these pairs the
    ``n`` where the clean prompt raises its answer's log-probability most over the corrupted
    one (a random model has no "correctly answered" prompts; this keeps the pairs where the
    subject matters, so that faithfulness has a denominator away from 0)."""
    from collections import Counter

    from mechlingo.core.tokens import encode
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en"], relations=["capital"])
    lengths = [int(encode(model, [f.prompt]).lengths[0]) for f in facts]
    common = Counter(lengths).most_common(1)[0][0]
    same = [f for f, k in zip(facts, lengths, strict=True) if k == common]
    pairs = []
    for i, f in enumerate(same):
        g = next((g for g in same[i + 1 :] + same[:i] if g.answer != f.answer), None)
        if g is not None:
            pairs.append((f, g))
    ans = torch.tensor([int(model.to_tokens(" " + f.answer, prepend_bos=False)[0, 0])
                        for f, _ in pairs])  # fmt: skip
    cb = encode(model, [f.prompt for f, _ in pairs])
    xb = encode(model, [g.prompt for _, g in pairs])

    def lp(batch):
        return model(batch.tokens)[:, -1].log_softmax(-1).gather(1, ans[:, None])[:, 0]

    keep = torch.argsort(lp(cb) - lp(xb), descending=True)[:n].sort().values.tolist()
    return (cb.select(keep), xb.select(keep), ans[keep],
            [(pairs[i][0].prompt, pairs[i][1].prompt) for i in keep], len(pairs))  # fmt: skip


class Ours:
    """mechlingo's side: the graph, the scores, exact patching for faithfulness."""

    def __init__(self, model, clean, corrupt, ans):
        from mechlingo.analyses.circuits import EdgePatcher, build_graph

        self.model, self.graph, self.ans = model, build_graph(model), ans
        self.clean, self.corrupt = clean, corrupt
        self.roles = clean.mask.float()[:, :, None]
        self.patcher = EdgePatcher(model, self.graph, clean, corrupt, self.readout, self.roles,
                                   batch_size=clean.batch_size)  # fmt: skip

    def readout(self, final, rows):
        from mechlingo.kernels.readout import apply_final_norm, unembed

        logits = unembed(self.model, apply_final_norm(self.model, final))
        return logits.log_softmax(-1).gather(1, self.ans[rows.cpu()][:, None])[:, 0]

    def scores(self, steps: int) -> dict[tuple[str, str], float]:
        from mechlingo.analyses.circuits import edge_scores

        with torch.enable_grad():
            s, cl, co = edge_scores(self.model, self.graph, self.clean, self.corrupt,
                                    self.readout, self.roles, steps=steps,
                                    batch_size=self.clean.batch_size)  # fmt: skip
        self.clean_metric, self.corrupt_metric = float(cl.mean()), float(co.mean())
        g, mean = self.graph, s.mean(0)[:, :, 0]
        return {(g.senders[a].name, g.receivers[b].name): float(mean[a, b])
                for a, b in g.mask.nonzero().tolist()}  # fmt: skip

    def faithfulness(self, scores, fractions) -> dict[float, tuple[int, tuple]]:
        """Faithfulness (ratio of means, 95% bootstrap interval over pairs) of the top edges
        by |score| at each fraction."""
        g = self.graph
        index = {(s.name, r.name): (i, j) for i, s in enumerate(g.senders)
                 for j, r in enumerate(g.receivers)}  # fmt: skip
        order = sorted(scores, key=lambda e: -abs(scores[e]))
        clean = self.patcher.read(torch.zeros_like(g.mask)[:, :, None])
        corr = self.patcher.read(g.mask[:, :, None])
        out = {}
        for f in fractions:
            keep = order[: max(1, round(f * len(order)))]
            removed = g.mask.clone()
            for e in keep:
                removed[index[e]] = False
            m = self.patcher.read(removed[:, :, None])
            out[f] = (len(keep), interval(m, clean, corr))
        return out


def interval(m: torch.Tensor, clean: torch.Tensor, corr: torch.Tensor) -> tuple:
    """Faithfulness ``mean(m - corr) / mean(clean - corr)`` with its 95% percentile bootstrap
    interval over the pairs (mechlingo's ``ratio_interval``, each pair its own cluster)."""
    from mechlingo.analyses.circuits.faithfulness import ratio_interval

    return ratio_interval(m - corr, clean - corr, [str(i) for i in range(len(m))])


def to_ours(name: str) -> tuple[str, str]:
    """auto-circuit's edge name (``src->dest``) as mechlingo's (sender, receiver) names."""
    src, dest = name.split("->")
    if src == "Resid Start":
        s = "embed"
    elif src.startswith("MLP"):
        s = f"m{src[4:]}"
    else:
        layer, head = src[1:].split(".")
        s = f"a{layer}.h{head}"
    if dest == "Resid End":
        return s, "logits"
    if dest.startswith("MLP"):
        return s, f"mlp{dest[4:]}"
    return s, f"attn{dest[1:].split('.')[0]}"


def compare(ours: dict, theirs: dict, scale: float) -> tuple[float, float, float, int]:
    """Spearman (signed, absolute) over matching edges, the largest difference relative to
    the largest score, and the number of edges; ``theirs`` summed per mechlingo edge and
    multiplied by ``scale``."""
    from scipy.stats import spearmanr

    summed: dict[tuple[str, str], float] = {}
    for e, v in theirs.items():
        k = to_ours(e)
        summed[k] = summed.get(k, 0.0) + v * scale
    keys = sorted(ours)
    missing = set(ours) ^ set(summed)
    assert not missing, f"edges without a match: {sorted(missing)[:5]}"
    a, b = [ours[k] for k in keys], [summed[k] for k in keys]
    gap = max(abs(x - y) for x, y in zip(a, b, strict=True)) / max(abs(x) for x in a)
    rho = float(spearmanr(a, b).statistic)
    rho_abs = float(spearmanr([abs(x) for x in a], [abs(x) for x in b]).statistic)
    return rho, rho_abs, gap, len(keys)


def peer_python(given: str | None) -> Path | None:
    for p in [given, os.environ.get("PEER_AUTOCIRCUIT"), ROOT / ".venv-autocircuit"]:
        if p:
            py = Path(p) / "bin" / "python" if Path(p).is_dir() else Path(p)
            if py.is_file():
                return py
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=16, help="clean/corrupted pairs (default 16)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG steps (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model's weights")
    ap.add_argument("--std", type=float, default=0.6, help="std of the model's weights")
    ap.add_argument("--repeats", type=int, default=3, help="timing: best of N (default 3)")
    ap.add_argument("--peer", default=None, help="auto-circuit's environment or python")
    ap.add_argument("--side", choices=["ours", "theirs"], default="ours", help=argparse.SUPPRESS)
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side == "theirs":  # in auto-circuit's environment: job in, results out
        job = torch.load(args.job, weights_only=False)
        torch.save(run_theirs(job), job["out"])
        return
    py = peer_python(args.peer)
    if py is None:
        raise SystemExit("auto-circuit: not installed (build it with "
                         "scripts/build_peer_envs.sh autocircuit)")  # fmt: skip
    torch.set_grad_enabled(False)
    sys.path.insert(0, str(ROOT))
    from mechlingo.core.models import load_model

    folder = build_folder(args.seed, args.std)
    model = load_model(str(folder), device="cpu")
    clean, corrupt, ans, prompts, n_all = make_pairs(model, args.pairs)
    n, T = clean.tokens.shape
    assert bool(clean.mask.all()) and bool(corrupt.mask.all())  # one length: no padding
    print(f"model: tiny GPT-2 (4 layers x 4 heads, d_model 64, random weights, std {args.std}, "
          f"seed {args.seed}); {n} English capital pairs of {T} tokens (of {n_all}: those "
          f"where the subject raises the answer most), e.g. {prompts[0][0]!r} / "
          f"{prompts[0][1]!r}; torch threads {torch.get_num_threads()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        job = {"folder": str(folder), "clean": clean.tokens, "corrupt": corrupt.tokens,
               "ans": ans, "steps": args.steps, "repeats": args.repeats,
               "fractions": FRACTIONS, "out": str(Path(tmp, "theirs.pt"))}  # fmt: skip
        torch.save(job, Path(tmp, "job.pt"))
        proc = subprocess.run([str(py), __file__, "--side", "theirs", "--job",
                               str(Path(tmp, "job.pt"))], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=""))  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"auto-circuit run failed:\n{proc.stderr[-3000:]}")
        theirs = torch.load(job["out"], weights_only=False)
    ours = Ours(model, clean, corrupt, ans)
    eap = ours.scores(1)
    ig, t_ours = cpu_timed(lambda: ours.scores(args.steps), args.repeats)
    print(f"edges: mechlingo {len(ig)}, auto-circuit {theirs['n_edges']} (head inputs summed "
          f"per layer to match); clean / corrupted readout: mechlingo {ours.clean_metric:.4f} / "
          f"{ours.corrupt_metric:.4f}, auto-circuit {theirs['clean']:.4f} / "
          f"{theirs['corrupt']:.4f}")  # fmt: skip
    rho, rho_abs, gap, k = compare(eap, theirs["eap"], -1.0)
    print(
        f"EAP (the same quantity on both sides): Spearman {rho:.4f} (|score| {rho_abs:.4f}) "
        f"over {k} edges, largest difference {gap:.1e} of the largest score"
    )
    rho, rho_abs, gap, k = compare(ig, theirs["ig"], -1.0 / (args.steps + 1))
    print(f"EAP-IG, {args.steps} steps (embeddings vs edge masks interpolated): Spearman "
          f"{rho:.3f} (|score| {rho_abs:.3f}) over {k} edges")  # fmt: skip
    print(
        "faithfulness of the top edges (ratio of means over the pairs, each tool's own "
        "patching of every edge outside the circuit):"
    )
    f_o = ours.faithfulness(ig, FRACTIONS)
    rows, n_t = theirs["rows"], theirs["n_edges"]
    for f in FRACTIONS:
        k = theirs["size"][f]
        a, b = f_o[f][1], interval(rows[k], rows[n_t], rows[0])
        print(f"  top {f:.0%}: mechlingo {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}] ({f_o[f][0]} "
              f"edges), auto-circuit {b[0]:.3f} [{b[1]:.3f}, {b[2]:.3f}] ({k} edges); "
              f"n = {n} pairs")  # fmt: skip
    print(f"EAP-IG scoring time (CPU s, best of {args.repeats}): mechlingo {t_ours:.3f}, "
          f"auto-circuit {theirs['seconds']:.3f}")  # fmt: skip
    print()
    print(f"mechlingo eap-ig vs auto-circuit: {theirs['seconds'] / t_ours:.1f}x")


if __name__ == "__main__":
    main()
