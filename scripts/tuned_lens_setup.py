"""What the two tuned-lens checks (``check_tuned_lens_interop.py``,
``check_tuned_lens_reference.py``) set up alike, on both sides of the environment split.

* mechlingo's side: :func:`tiny_model_and_lens`, a tiny random Gemma-3 model written to a
  folder and loaded, and a mechlingo lens with random non-zero translators (seeded, so both
  checks and both runs of a check see the same numbers);
* the package's side: :func:`patch_final_norm`, the one adapter ``tuned-lens`` 0.2.0 needs
  for Gemma 3 (it predates it): its final-norm lookup falls back to the model's own final
  RMSNorm; everything else is the package's code.

Each function imports its own side's packages, so this module loads in either environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def tiny_model_and_lens(folder: Path) -> tuple[Any, Any, Path]:
    """``(model, lens, model_dir)``: a 3-layer tiny model saved under ``folder / "model"``
    and loaded on the CPU, and a :class:`~mechlingo.analyses.decoders.tuned_lens.TunedLens`
    whose translators are drawn with seed 0 (weights N(0, 0.05), biases N(0, 0.5))."""
    from mechlingo.analyses.decoders.tuned_lens import TunedLens
    from mechlingo.core.models import load_model
    from mechlingo.testing import build_tiny_folder

    torch.manual_seed(0)
    model_dir = build_tiny_folder(folder / "model", n_layers=3)
    model = load_model(model_dir, device="cpu")
    lens = TunedLens.for_model(model)
    with torch.no_grad():
        lens.weight.normal_(0, 0.05)
        lens.bias.normal_(0, 0.5)
    return model, lens, model_dir


def patch_final_norm() -> None:
    """Point ``tuned-lens``'s final-norm lookup at ``model.base_model.norm`` for the
    architectures it does not know (Gemma 3); known ones keep the package's own lookup."""
    from tuned_lens import model_surgery
    from tuned_lens.nn import unembed

    known = model_surgery.get_final_norm

    def final_norm(m: Any) -> Any:
        try:
            return known(m)
        except NotImplementedError:
            return m.base_model.norm

    unembed.model_surgery.get_final_norm = final_norm
