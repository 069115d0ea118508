"""Check mechlingo's tuned-lens objective against the ``tuned-lens`` package (PyPI) on a
tiny model: the same translators, the same tokens, the same per-layer KL(final || lens).

The package needs its own environment (it pins its own dependencies):

    bash scripts/build_tunedlens_env.sh                                 # .venv-tunedlens
    python scripts/check_tuned_lens_reference.py dump /tmp/tlref        # mechlingo's venv
    .venv-tunedlens/bin/python scripts/check_tuned_lens_reference.py check /tmp/tlref

(``scripts/check_tuned_lens_interop.py`` checks the saved-lens formats the same way.)

``dump`` writes a tiny random Gemma-3 model, random non-zero translators, token ids and
mechlingo's per-layer loss (:func:`mechlingo.analyses.decoders.tuned_lens.translator_kl`, mean over
tokens); ``check`` loads the same model with ``transformers``, puts the translators into the
package's ``TunedLens`` (its ``layer_translators[i]`` is ``h -> W h + b``, added to ``h``),
computes the package's training loss (``scripts/train_loop.py``: ``sum(p * (log p - log q))``
averaged over tokens, p from the final logits) and prints the largest difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tuned_lens_setup import patch_final_norm, tiny_model_and_lens


def dump(folder: Path) -> None:
    from mechlingo.analyses.decoders.entries import lens_hook_names
    from mechlingo.analyses.decoders.tuned_lens import translator_kl
    from mechlingo.kernels.readout import apply_final_norm, unembed

    model, lens, model_dir = tiny_model_and_lens(folder)
    tokens = model.to_tokens("The capital of Italy is Rome. La capitale de la France est Paris.")
    n = model.cfg.n_layers
    names = lens_hook_names(model, list(range(n + 1)))
    _, cache = model.run_with_cache(tokens, names_filter=lambda x: x in names)
    acts = [cache[nm][0, 1:] for nm in names]  # BOS dropped, as in training
    with torch.no_grad():
        W = model.W_U.detach().float()
        target = torch.log_softmax(unembed(model, apply_final_norm(model, acts[n]), W), -1)
        ours = [float(translator_kl(model, lens, e, acts[e], target, W).mean()) for e in range(n)]
        logit = [float(translator_kl(model, None, e, acts[e], target, W).mean()) for e in range(n)]
    torch.save({"weight": lens.weight.detach(), "bias": lens.bias.detach(), "tokens": tokens,
                "ours": ours, "logit": logit, "model": str(model_dir)}, folder / "ref.pt")  # fmt: skip
    print("mechlingo per-layer KL:", [round(x, 6) for x in ours])


def check(folder: Path) -> None:
    from transformers import AutoModelForCausalLM
    from tuned_lens.nn.lenses import LogitLens, TunedLens

    ref = torch.load(folder / "ref.pt")
    model = AutoModelForCausalLM.from_pretrained(ref["model"], dtype=torch.float32).eval()
    patch_final_norm()  # tuned-lens 0.2.0 does not know Gemma 3
    lens = TunedLens.from_model(model)
    logit_lens = LogitLens.from_model(model)
    with torch.no_grad():
        for i, t in enumerate(lens.layer_translators):
            t.weight.copy_(ref["weight"][i])
            t.bias.copy_(ref["bias"][i])
        out = model(ref["tokens"], output_hidden_states=True)
        labels = out.logits.float().log_softmax(-1)
        theirs, logit = [], []
        for i, h in enumerate(out.hidden_states[:-1]):
            for dest, lz in ((theirs, lens), (logit, logit_lens)):
                q = lz(h, idx=i).float().log_softmax(-1)
                kl = torch.sum(labels.exp() * (labels - q), dim=-1)[:, 1:].mean()  # BOS dropped
                dest.append(float(kl))
    for name, a, b in (("tuned", ref["ours"], theirs), ("logit", ref["logit"], logit)):
        diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
        print(f"{name}: mechlingo {[round(x, 6) for x in a]}")
        print(f"{name}: tuned-lens {[round(x, 6) for x in b]}")
        print(f"{name}: largest difference {diff:.2e}")


if __name__ == "__main__":
    {"dump": dump, "check": check}[sys.argv[1]](Path(sys.argv[2]))
