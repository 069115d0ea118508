"""Decoders beside the logit lens: the tuned lens (objective, identity, save/load, data
parallelism), the patchscope (against a hand-built patched run, batched == one by one), the
shared ``lens_facts(decoder=...)`` API, entropy and token energy, the English-lead table and
the command line."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from mechlingo.analyses.decoders.compare import DecoderComparison, compare_decoders, english_lead
from mechlingo.analyses.decoders.entries import lens_hook_names
from mechlingo.analyses.decoders.lens import LensResult, lens_facts, logit_lens, token_energy
from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.patchscope import TARGET_PROMPTS, Patchscope
from mechlingo.analyses.decoders.tuned_lens import (
    TunedLens,
    _SampledTarget,
    load_tuned_lens,
    mix_texts,
    sampled_translator_kl,
    token_residuals,
    train_tuned_lens,
    translator_kl,
)
from mechlingo.cli.main import main
from mechlingo.core.errors import ArtifactError, InputError, ModelMismatchError
from mechlingo.data import load_facts
from mechlingo.data.prompts import parallel_sentences
from mechlingo.kernels.readout import final_logits, read_logits
from tests.forks import torchrun

PROMPTS = ["The capital of Italy is the city of", "La capitale", "意大利的首都是", "Die Stadt"]
LANGS = ["en", "fr", "zh", "de"]
ANSWERS = {"answer": ["Rome", "Paris", "罗马", "Rom"], "en": ["Rome", "Paris", "Rome", "Rome"]}
TEXTS = mix_texts(parallel_sentences(["en", "fr", "de"]), 6)


@pytest.fixture(scope="module")
def trained(tiny):
    """A tuned lens on the tiny model, trained enough to move away from the identity."""
    return train_tuned_lens(
        tiny, TEXTS, TrainingOptions(steps=6, texts_per_step=6, lr=1e-2, seed=1)
    )


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm written out: x / rms(x) * (1 + w)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1 + w)


# ----------------------------------------------------------------------------- tuned lens


def test_objective_equals_hand_computation(tiny, trained):
    """KL(final || lens) with the translator, final RMSNorm and unembedding written out."""
    lens, n = trained.lens, tiny.cfg.n_layers
    acts, _ = token_residuals(tiny, TEXTS[:3], list(range(n + 1)))
    ln = tiny.ln_final
    w = next(p for name, p in ln.named_parameters() if name.endswith("weight")).detach()
    eps = float(getattr(tiny.cfg, "eps", 1e-6))
    W = tiny.W_U.detach().float()
    p = torch.log_softmax(_rms(acts[n], w, eps) @ W, -1)
    for e in range(n):
        x = acts[e] + acts[e] @ lens.weight[e].detach().T + lens.bias[e].detach()
        q = torch.log_softmax(_rms(x, w, eps) @ W, -1)
        by_hand = (p.exp() * (p - q)).sum(-1)
        ours = translator_kl(tiny, lens, e, acts[e], p, W).detach()
        torch.testing.assert_close(ours, by_hand, atol=1e-4, rtol=1e-4)


def test_sampled_objective_is_exact_over_the_whole_vocabulary(tiny, trained):
    n, V = tiny.cfg.n_layers, tiny.W_U.shape[1]
    acts, _ = token_residuals(tiny, TEXTS[:2], list(range(n + 1)))
    W = tiny.W_U.detach().float()
    logp = torch.log_softmax(final_logits(tiny, acts[n]), -1)
    gen = torch.Generator().manual_seed(0)
    full = _SampledTarget.build(logp, top_k=V, sample=0, gen=gen)  # support = vocabulary
    exact = translator_kl(tiny, trained.lens, 0, acts[0], logp, W)
    torch.testing.assert_close(
        sampled_translator_kl(tiny, trained.lens, 0, acts[0], full, W), exact, atol=1e-4, rtol=0
    )
    # a small support with the whole rest as the sample: the grouped KL, never above the exact
    grouped = _SampledTarget.build(logp, top_k=5, sample=V, gen=gen)
    assert grouped.rest.numel() == grouped.n_rest
    kl = sampled_translator_kl(tiny, trained.lens, 0, acts[0], grouped, W)
    assert bool((kl <= exact + 1e-4).all()) and bool((kl > 0).all())


def test_identity_at_the_last_layer_and_at_init(tiny, trained):
    """The output entry is untranslated: the trained lens gives the model's own output there
    (within 1e-5); an untrained lens is the logit lens at every entry (exactly)."""
    lens = trained.lens
    h = torch.randn(3, tiny.cfg.d_model)
    assert torch.equal(lens(h, tiny.cfg.n_layers), h)
    assert float(lens.weight.abs().max()) > 1e-3  # it did train
    tuned = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, decoder=lens)
    for i, p in enumerate(PROMPTS):
        logp = torch.log_softmax(tiny(tiny.to_tokens(p))[0, -1], -1)
        torch.testing.assert_close(
            tuned.top_logprobs[-1, i], logp.topk(5).values, atol=1e-5, rtol=0
        )
    fresh = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, decoder=TunedLens.for_model(tiny))
    plain = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS)
    assert torch.equal(fresh.logprob, plain.logprob) and torch.equal(fresh.rank, plain.rank)


def test_training_lowers_the_kl(trained):
    first, last = trained.loss[0].mean(), trained.loss[-2:].mean()
    assert float(last) < float(first)
    assert trained.lens.meta["steps_done"] == 6 and trained.lens.meta["tokens"] == sum(
        trained.tokens
    )


def test_saved_lens_loads_and_refuses_another_model(tiny, trained, tmp_path):
    from mechlingo.core.models import load_model
    from mechlingo.testing import build_tiny_folder

    trained.lens.save(tmp_path / "lens")
    back = load_tuned_lens(tmp_path / "lens", tiny)
    assert torch.equal(back.weight, trained.lens.weight.detach())
    assert back.model_info["unembed_fingerprint"] == trained.lens.model_info["unembed_fingerprint"]
    other = load_model(build_tiny_folder(tmp_path / "other", seed=1), device="cpu")
    with pytest.raises(ModelMismatchError, match="unembed_fingerprint"):
        load_tuned_lens(tmp_path / "lens", other)
    with pytest.raises(ModelMismatchError):
        lens_facts(other, load_facts(langs=["en"], limit=1), decoder=back)
    (tmp_path / "lens" / "translators.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ArtifactError):
        load_tuned_lens(tmp_path / "lens")
    with pytest.raises(FileNotFoundError):
        load_tuned_lens(tmp_path / "nothing")


def test_training_errors(tiny):
    with pytest.raises(InputError, match="no training text"):
        train_tuned_lens(tiny, ["", "  "])
    with pytest.raises(InputError):
        train_tuned_lens(tiny, TEXTS, TrainingOptions(steps=0))
    with pytest.raises(InputError, match="no text"):
        mix_texts({"en": ["a"], "fr": []})


WORKER = textwrap.dedent(
    """
    import sys, torch
    from mechlingo.core.distributed import process_group
    from mechlingo.analyses.decoders.options import TrainingOptions
    from mechlingo.analyses.decoders.tuned_lens import train_tuned_lens
    from mechlingo.core.models import load_model

    torch.set_grad_enabled(False)
    model_dir, out, texts = sys.argv[1], sys.argv[2], eval(sys.argv[3])
    with process_group() as info:
        model = load_model(model_dir, device="cpu")
        tr = train_tuned_lens(model, texts, TrainingOptions(steps=3, texts_per_step=4, lr=1e-2))
        torch.save({"w": tr.lens.weight.detach(), "b": tr.lens.bias.detach(),
                    "loss": tr.loss, "world": tr.world_size}, f"{out}/rank{info.rank}.pt")
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_two_processes_train_the_same_lens_as_one(tiny, tiny_dir, tmp_path):
    """torchrun --nproc_per_node 2 (forked, :func:`tests.forks.torchrun`): each rank trains on
    its half of every step's texts; the all-reduced gradients give the one-process lens on
    both ranks."""
    texts = TEXTS[:8]
    (tmp_path / "worker.py").write_text(WORKER)
    cmd = [str(tmp_path / "worker.py"), str(tiny_dir), str(tmp_path), repr(texts)]
    proc = torchrun(cmd, tmp_path / "torchrun.log")
    assert proc.returncode == 0, proc.stdout[-3000:]
    one = train_tuned_lens(tiny, texts, TrainingOptions(steps=3, texts_per_step=4, lr=1e-2))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["world"] == 2
        torch.testing.assert_close(got["loss"], one.loss, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got["w"], one.lens.weight.detach(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got["b"], one.lens.bias.detach(), atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- patchscope


def _hand_patchscope(model, source: str, entry: int, target: str) -> torch.Tensor:
    """The patchscope by hand: the source's last-token state at ``entry``, written with
    ``run_with_hooks`` into the target prompt's last position at the same depth."""
    name = lens_hook_names(model, [entry])[0]
    _, cache = model.run_with_cache(model.to_tokens(source), names_filter=lambda x: x == name)
    state = cache[name][0, -1]

    def patch(t, hook):
        t[0, -1] = state
        return t

    logits = model.run_with_hooks(model.to_tokens(target), fwd_hooks=[(name, patch)])
    return torch.log_softmax(logits[0, -1].float(), -1)


def test_patchscope_equals_a_hand_built_patched_run(tiny):
    n = tiny.cfg.n_layers
    res = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, decoder=Patchscope(), top_k=4)
    for i in (0, 2):
        for li, entry in enumerate(res.layers):
            ref = _hand_patchscope(tiny, PROMPTS[i], entry, TARGET_PROMPTS[LANGS[i]])
            top = ref.topk(4)
            assert torch.equal(res.top_ids[li, i], top.indices), (i, entry)
            torch.testing.assert_close(res.top_logprobs[li, i], top.values, atol=1e-5, rtol=0)
    # the output entry replaces the target's final state: the model's own output
    plain = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, top_k=4)
    torch.testing.assert_close(res.logprob[n], plain.logprob[n], atol=1e-5, rtol=0)


def test_patchscope_batched_equals_one_by_one(tiny):
    ps = Patchscope(batch_size=5, max_new_tokens=3)  # rows of several entries per pass
    batched = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, decoder=ps, batch_size=4)
    for i, p in enumerate(PROMPTS):
        alone = logit_lens(tiny, [p], {k: [v[i]] for k, v in ANSWERS.items()}, langs=[LANGS[i]],
                           decoder=Patchscope(batch_size=1, max_new_tokens=3), batch_size=1)  # fmt: skip
        torch.testing.assert_close(batched.logprob[:, i], alone.logprob[:, 0], atol=1e-5, rtol=0)
        assert torch.equal(batched.top_ids[:, i], alone.top_ids[:, 0])
        got = [row[i] for row in batched.meta["continuations"]]
        assert got == [row[0] for row in alone.meta["continuations"]]


def test_patchscope_continuation_is_greedy(tiny):
    """The first continuation token is the arg-max of the patchscope's distribution."""
    ps = Patchscope(max_new_tokens=2)
    res = logit_lens(tiny, PROMPTS[:2], {"a": ["x", "y"]}, langs=LANGS[:2], decoder=ps, top_k=1)
    for li in range(len(res.layers)):
        for i in range(2):
            first = tiny.tokenizer.decode([int(res.top_ids[li, i, 0])])
            assert res.meta["continuations"][li][i].startswith(first)


# ----------------------------------------------------------------------------- one API


def _old_logit_lens(model, prompts, answers, langs):
    """Today's logit lens, step by step: collect + read_logits."""
    from mechlingo.activations.runs import collect
    from mechlingo.core.answers import answer_tokens, pack_token_sets
    from mechlingo.core.tokens import encode

    n = model.cfg.n_layers
    names = lens_hook_names(model, list(range(n + 1)))
    sets = [[answer_tokens(model, answers[t][i], lang=langs[i]) for t in answers]
            for i in range(len(prompts))]  # fmt: skip
    ids, prim = pack_token_sets(sets)
    out = []
    for i, p in enumerate(prompts):
        acts = collect(model, encode(model, [p]), names)
        flat = torch.cat([acts[nm] for nm in names])
        out.append(
            read_logits(model, flat, ids[[i]].repeat(n + 1, 1, 1), prim[[i]].repeat(n + 1, 1))
        )
    return out


def test_lens_facts_with_every_decoder(tiny, trained):
    facts = load_facts(langs=["en", "fr", "de"], limit=2)
    old = _old_logit_lens(tiny, [f.prompt for f in facts],
                          {"answer": [f.answer for f in facts],
                           "en": [f.answer_en or f.answer for f in facts]},
                          [f.lang for f in facts])  # fmt: skip
    results = {d: lens_facts(tiny, facts, decoder=d, decoder_options={"tuned_lens": trained.lens},
                             batch_size=3)
               for d in ("logit", "tuned", "patchscope")}  # fmt: skip
    shape = results["logit"].logprob.shape
    assert shape == (tiny.cfg.n_layers + 1, len(facts), 2)
    for d, r in results.items():
        assert r.decoder == d and r.logprob.shape == shape and r.rank.shape == shape
        assert r.entropy.shape == r.energy.shape == shape[:2]
        assert bool(torch.isfinite(r.entropy).all()) and bool((r.energy > 0).all())
        # every decoder agrees at the output entry
        torch.testing.assert_close(r.logprob[-1], results["logit"].logprob[-1], atol=1e-5, rtol=0)
    logit = lens_facts(tiny, facts, decoder="logit", batch_size=1)  # the same passes as `old`
    for i, o in enumerate(old):
        assert torch.equal(logit.logprob[:, i], o.set_logprob)
        assert torch.equal(logit.rank[:, i], o.set_rank)
        assert torch.equal(logit.top_ids[:, i], o.top_ids)
    with pytest.raises(InputError, match="decoder .tuned. needs tuned_lens="):
        lens_facts(tiny, facts, decoder="tuned")
    with pytest.raises(InputError, match="unknown decoder"):
        lens_facts(tiny, facts, decoder="jacobian")


def test_entropy_and_energy_by_hand(tiny):
    res = logit_lens(tiny, PROMPTS[:2], {"a": ["x", "y"]}, langs=LANGS[:2])
    names = lens_hook_names(tiny, res.layers)
    _, cache = tiny.run_with_cache(tiny.to_tokens(PROMPTS[0]), names_filter=lambda x: x in names)
    rows = torch.stack([cache[nm][0, -1] for nm in names])
    x = tiny.ln_final(rows.unsqueeze(0)).squeeze(0).float()
    logp = torch.log_softmax(x @ tiny.W_U.float() + getattr(tiny, "b_U", 0), -1)
    torch.testing.assert_close(
        res.entropy[:, 0], -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-4
    )
    Wc = tiny.W_U.float() - tiny.W_U.float().mean(1, keepdim=True)
    ratio = ((x @ Wc) ** 2).sum(-1) / (x**2).sum(-1)
    expected = ratio / ((Wc**2).sum() / Wc.shape[0])
    torch.testing.assert_close(res.energy[:, 0], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(token_energy(tiny, rows), res.energy[:, 0], atol=1e-5, rtol=1e-5)


def _fake_result(
    p_answer: list[list[float]], p_en: list[list[float]], langs: list[str]
) -> LensResult:
    """A lens result with given probabilities ``[entry][prompt]`` (the last entry = output)."""
    lp = torch.stack([torch.tensor(p_answer), torch.tensor(p_en)], -1).log()
    n_e, n_p = lp.shape[:2]
    z = torch.zeros(n_e, n_p, 1)
    return LensResult(prompts=["p"] * n_p, langs=langs, tracks=["answer", "en"],
                      answers={"answer": ["Roma"] * n_p, "en": ["Rome"] * n_p},
                      layers=list(range(n_e)), logprob=lp, primary_logprob=lp,
                      rank=torch.zeros(n_e, n_p, 2, dtype=torch.long), top_ids=z.long(),
                      top_logprobs=z, top_tokens=[[[""]] * n_p] * n_e,
                      n_answer_tokens=torch.ones(n_p, 2, dtype=torch.long), n_layers=n_e - 1)  # fmt: skip


def test_english_lead_by_hand():
    # 3 prompts, entries 0..4 (4 = output, ignored): English leads at 2..3, 1..2 and never
    ans = [
        [0.001, 0.001, 0.001],
        [0.01, 0.02, 0.3],
        [0.02, 0.01, 0.3],
        [0.05, 0.5, 0.4],
        [0.9, 0.9, 0.9],
    ]
    en = [
        [0.002, 0.002, 0.0],
        [0.005, 0.3, 0.1],
        [0.4, 0.3, 0.1],
        [0.3, 0.1, 0.1],
        [0.05, 0.05, 0.05],
    ]
    out = english_lead(_fake_result(ans, en, ["es"] * 3), min_prob=0.01)["es"]
    assert out["n"] == 3 and out["ever"]["k"] == 2  # entry 0 is below the floor
    assert out["first_layer"]["estimate"] == pytest.approx(1.5)  # first layers 2 and 1
    assert [w["k"] for w in out["share_by_layer"]] == [0, 1, 2, 1]
    assert out["range"]["layers"] == [] or set(out["range"]["layers"]) <= {1, 2, 3}
    cmp = DecoderComparison({"logit": _fake_result(ans, en, ["es"] * 3)})
    row = cmp.pivot_table(min_prob=0.01)[0]
    assert row["decoder"] == "logit" and row["n"] == 3 and row["ever"] == pytest.approx(2 / 3)


def test_compare_decoders_figure(tiny):
    facts = load_facts(langs=["en", "fr"], limit=2)
    cmp = compare_decoders(tiny, facts, ["logit", "patchscope"])
    fig = cmp.fig_curves()
    n_fr = sum(f.lang == "fr" for f in facts)
    assert len(fig.data) == 2 * 12 and f"n = {n_fr};" in fig.layout.title.text


# ----------------------------------------------------------------------------- command line


def test_cli_trains_a_lens_and_reads_with_every_decoder(tiny_dir, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXTS), encoding="utf-8")
    lens_dir = tmp_path / "lens"
    args = ["tuned-lens", "--model", str(tiny_dir), "--text-file", str(text), "--steps", "2",
            "--texts-per-step", "4", "--lines", "12", "--heldout", "6", "--quiet",
            "--out", str(lens_dir)]  # fmt: skip
    assert main(args) == 0
    held = json.loads((lens_dir / "summary.json").read_text())["heldout_kl"]
    assert set(held["decoders"]) == {"logit", "tuned"} and held["n_texts"] == 6
    assert {p.name for p in lens_dir.iterdir()} >= {"translators.safetensors", "tuned_lens.json",
                                                    "loss.csv", "summary.json", "report.html"}  # fmt: skip
    out = tmp_path / "out"
    args = ["lens", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "2", "--quiet",
            "--decoder", "logit,tuned,patchscope", "--tuned-lens", str(lens_dir),
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["decoders"]) == ["logit", "tuned", "patchscope"]
    assert {r["decoder"] for r in summary["english_lead"]} == {"logit", "tuned", "patchscope"}
    bad = ["lens", "--model", str(tiny_dir), "--decoder", "tuned", "--out", str(tmp_path / "b")]
    assert main(bad) == 2 and not (tmp_path / "b").exists()
    assert main(bad[:-2] + ["--tuned-lens", str(tmp_path), "--out", str(tmp_path / "b")]) == 2


@pytest.mark.slow
def test_patchscope_on_gemma_equals_hand_built_run(gemma):
    """On the embedded model: the patchscope of two entries against run_with_hooks by hand,
    and the output entry against the model's own next-token distribution."""
    prompt = "La capital de Italia es la ciudad de"
    res = logit_lens(gemma, [prompt], {"a": ["Roma"]}, langs=["es"], decoder=Patchscope(),
                     layers=[12, 18], top_k=3)  # fmt: skip
    for li, entry in enumerate(res.layers):
        ref = _hand_patchscope(gemma, prompt, entry, TARGET_PROMPTS["es"])
        assert torch.equal(res.top_ids[li, 0], ref.topk(3).indices)
        torch.testing.assert_close(res.top_logprobs[li, 0], ref.topk(3).values, atol=1e-4, rtol=0)
    own = torch.log_softmax(gemma(gemma.to_tokens(prompt))[0, -1].float(), -1)
    assert torch.equal(res.top_ids[-1, 0], own.topk(3).indices)
