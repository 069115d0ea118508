"""Check mechlingo's tuned-lens interop against the ``tuned-lens`` package itself, both ways,
on a tiny random Gemma-3 model: per layer, the package's lens logits and mechlingo's agree
within 1e-5 (max absolute difference).

    bash scripts/build_tunedlens_env.sh                                    # .venv-tunedlens
    python scripts/check_tuned_lens_interop.py dump DIR                    # mechlingo's env
    .venv-tunedlens/bin/python scripts/check_tuned_lens_interop.py check DIR
    python scripts/check_tuned_lens_interop.py verify DIR                  # mechlingo's env

or all three in order: ``python scripts/check_tuned_lens_interop.py all DIR``.

* ``dump`` (mechlingo): writes the tiny model, a mechlingo lens with random non-zero
  translators exported in the package's format (``DIR/ours``, by
  :func:`mechlingo.analyses.decoders.tuned_lens_interop.export_package_lens`), token ids, and
  mechlingo's lens logits at every layer (``DIR/ours_logits.pt``);
* ``check`` (the package, in its own environment, without mechlingo): loads ``DIR/ours``
  with ``TunedLens.from_model_and_pretrained`` and compares its logits with mechlingo's;
  then makes a lens of its own with other random translators, saves it with
  ``TunedLens.save`` (``DIR/theirs``) and writes its logits (``DIR/theirs_logits.pt``);
* ``verify`` (mechlingo): loads ``DIR/theirs`` with
  :func:`~mechlingo.analyses.decoders.tuned_lens_interop.load_package_lens` and compares.

Each step prints ``<direction> layer i: max |diff| = x`` and exits 1 when a layer differs by
more than 1e-5. The files exchanged are plain tensors (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from tuned_lens_setup import patch_final_norm, tiny_model_and_lens

TOL = 1e-5
TEXT = "The capital of Italy is Rome. La capitale de la France est Paris. 東京は日本の首都です。"


def _report(direction: str, ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> bool:
    ok = len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        diff = float((a.float() - b.float()).abs().max())
        ok = ok and diff <= TOL and a.shape == b.shape
        print(f"{direction} layer {i}: max |diff| = {diff:.2e}")
    print(f"{direction}: {'agree' if ok else 'DIFFER'} within {TOL:g} ({len(ours)} layers)")
    return ok


def _mechlingo_logits(model, lens, tokens) -> list[torch.Tensor]:
    from mechlingo.analyses.decoders.entries import lens_hook_names
    from mechlingo.kernels.readout import apply_final_norm, unembed

    n = model.cfg.n_layers
    names = lens_hook_names(model, list(range(n)))
    _, cache = model.run_with_cache(tokens, names_filter=lambda x: x in names)
    W = model.W_U.detach().float()
    with torch.no_grad():
        return [unembed(model, apply_final_norm(model, lens(cache[nm][0], e)), W).cpu()
                for e, nm in enumerate(names)]  # fmt: skip


def dump(folder: Path) -> None:
    from mechlingo.analyses.decoders.tuned_lens_interop import export_package_lens

    model, lens, _ = tiny_model_and_lens(folder)
    export_package_lens(lens, folder / "ours", model=model)
    tokens = model.to_tokens(TEXT)
    logits = _mechlingo_logits(model, lens, tokens)
    torch.save({"tokens": tokens.cpu(), "logits": logits}, folder / "ours_logits.pt")
    print(f"dumped a {model.cfg.n_layers}-layer lens and its logits into {folder}")


def _package_logits(lens, model, tokens) -> list[torch.Tensor]:
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True).hidden_states
        return [lens(hidden[i][0], idx=i).float() for i in range(len(lens))]


def check(folder: Path) -> None:
    from transformers import AutoModelForCausalLM
    from tuned_lens.nn.lenses import TunedLens

    model = AutoModelForCausalLM.from_pretrained(folder / "model", dtype=torch.float32).eval()
    patch_final_norm()  # tuned-lens 0.2.0 predates Gemma 3
    ref = torch.load(folder / "ours_logits.pt", weights_only=True)
    lens = TunedLens.from_model_and_pretrained(model, lens_resource_id=str(folder / "ours"))
    ok = _report(
        "mechlingo -> tuned-lens", ref["logits"], _package_logits(lens, model, ref["tokens"])
    )
    torch.manual_seed(1)
    theirs = TunedLens.from_model(model)
    with torch.no_grad():
        for t in theirs.layer_translators:
            t.weight.normal_(0, 0.05)
            t.bias.normal_(0, 0.5)
    theirs.save(folder / "theirs")
    logits = _package_logits(theirs, model, ref["tokens"])
    torch.save({"logits": [x.cpu() for x in logits]}, folder / "theirs_logits.pt")
    sys.exit(0 if ok else 1)


def verify(folder: Path) -> None:
    from mechlingo.analyses.decoders.tuned_lens_interop import load_package_lens
    from mechlingo.core.models import load_model

    model = load_model(folder / "model", device="cpu")
    lens = load_package_lens(folder / "theirs", model)
    ref = torch.load(folder / "ours_logits.pt", weights_only=True)
    theirs = torch.load(folder / "theirs_logits.pt", weights_only=True)["logits"]
    ok = _report("tuned-lens -> mechlingo", _mechlingo_logits(model, lens, ref["tokens"]), theirs)
    sys.exit(0 if ok else 1)


def run_all(folder: Path) -> None:
    """The three steps, the middle one in the package's environment."""
    venv = Path(os.environ.get("TUNEDLENS_VENV", ".venv-tunedlens"))
    here = Path(__file__).resolve()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for step, python in (("dump", sys.executable), ("check", str(venv / "bin" / "python")),
                         ("verify", sys.executable)):  # fmt: skip
        run_env = os.environ if python == sys.executable else env
        proc = subprocess.run([python, str(here), step, str(folder)], env=run_env)
        if proc.returncode:
            sys.exit(proc.returncode)


if __name__ == "__main__":
    steps = {"dump": dump, "check": check, "verify": verify, "all": run_all}
    target = Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    steps[sys.argv[1]](target)
