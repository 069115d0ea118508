"""What a command will cost before it runs: measured per-item CPU seconds and the arithmetic
of an estimate.

:data:`SECONDS_PER_ITEM` is the one table of measured costs (``scripts/measure_costs.py``
times each operation on the public function the commands call, on the embedded model; the
date and the machine are in :data:`MEASURED_ON`). An estimate is the sum of ``items x
seconds per item`` over the operations a command's plan counts. For another model the
table is scaled by the ratio of parameter counts (read from the model's ``config.json``
without loading any weight: :func:`model_shape`), and the estimate says so; when no config
can be read (a ``.gguf`` file, a hub id not in the local cache) it says that it cannot know.
The numbers are CPU seconds on a machine like the one measured: another machine, thread
count or a GPU changes them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import try_to_load_from_cache

from mechlingo.core.errors import InputError
from mechlingo.core.untrusted import read_json

__all__ = [
    "MEASURED_ON",
    "SECONDS_PER_ITEM",
    "Estimate",
    "ModelSize",
    "config_params",
    "estimate",
    "model_shape",
]

#: the machine of the measurement (scripts/measure_costs.py)
MACHINE = "x86_64, 2 cores (AMD EPYC), torch 2.13 CPU build"
#: one tuned-lens step's CPU seconds (8 texts of 48 tokens)
LENS_STEP = 24.16
#: CPU seconds per item of each operation on the embedded model (batch 16 unless said; 16 prompts of the bundled facts):
#: ``prompt`` one fact prompt's forward pass (the prefill of a generation, a lens read);
#: ``token`` one greedily generated token of one prompt (key-value cache); ``patch_cell`` one
#: patched copy of a prompt (a forward in a batch of 64 copies); ``sentence`` one parallel
#: sentence's forward pass (~30 tokens: neuron statistics, an embedding, a perplexity);
#: ``lens_step`` one tuned-lens optimizer step (8 texts of 48 tokens); ``lens_read`` one fact
#: prompt read by ``lens_facts`` at every layer (forward, each entry decoded, tracks ranked);
#: ``lens_position`` one token position of the token-level lens (``logit_lens`` without
#: answers: top-5 at every layer). The two lens rows: 600 facts and 20 prompts, 2026-12-04.
SECONDS_PER_ITEM: dict[str, float] = {
    "prompt": 0.1353,
    "token": 0.04,
    "patch_cell": 0.1456,
    "sentence": 0.8866,
    "lens_step": LENS_STEP,
    "lens_read": 0.1923,
    "lens_position": 0.1572,
}
#: when, where and on what :data:`SECONDS_PER_ITEM` was measured (CPU seconds of one process,
#: ``time.process_time``, so the other jobs sharing the machine did not inflate them)
MEASURED_ON: dict[str, Any] = {
    "date": "2026-12-03",
    "machine": MACHINE,
    "threads": 1,
    "model": "google/gemma-3-270m (embedded)",
}
#: the embedded model's layer count (the plans count layers without loading the model)
EMBEDDED_LAYERS = 18


@dataclass(frozen=True)
class ModelSize:
    """What a plan needs of a model without its weights: ``n_layers``, the parameter count
    ``params`` (``None``: unknown) and ``source`` (where they were read)."""

    n_layers: int | None
    params: int | None
    source: str


def config_params(cfg: Mapping[str, Any]) -> int | None:
    """The parameter count of a transformers ``config.json`` (attention, MLP and the
    embedding; norms left out), or ``None`` when a size it needs is missing."""
    c = dict(cfg.get("text_config") or cfg)
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
            "num_attention_heads")  # fmt: skip
    sizes = [c.get(k) for k in keys]
    if not all(isinstance(x, int) and x > 0 for x in sizes):
        return None
    d, layers, m, vocab, heads = (int(x) for x in sizes)  # type: ignore[arg-type]
    head_dim = int(c.get("head_dim") or d // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    attn = 2 * d * heads * head_dim + 2 * d * kv * head_dim
    gated = str(c.get("hidden_act") or c.get("hidden_activation") or "").startswith(
        ("silu", "gelu_pytorch_tanh", "swish")
    ) or c.get("model_type", "").startswith(("llama", "gemma", "qwen", "mistral"))
    mlp = (3 if gated else 2) * d * m
    return int(layers * (attn + mlp) + vocab * d)


def _read_config(path: Path) -> ModelSize | None:
    try:
        cfg = read_json(path, InputError)
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    c = cfg.get("text_config") or cfg
    layers = c.get("num_hidden_layers")
    return ModelSize(layers if isinstance(layers, int) else None, config_params(cfg), str(path))


def _embedded_config() -> Path:
    root = Path(os.environ.get("MECHLINGO_CACHE") or Path.home() / ".cache" / "mechlingo")
    return root.expanduser() / "gemma-3-270m" / "config.json"


def model_shape(model: str | None) -> ModelSize:
    """The layers and parameter count of ``--model`` from its ``config.json`` only: the
    embedded model's (``None``), a local folder's, or a hub id's in the local hub cache
    (no download). ``params`` is ``None`` when no config can be read (a ``.gguf`` file, a
    hub id never downloaded)."""
    if model is None:
        shape = _read_config(_embedded_config())
        return shape or ModelSize(EMBEDDED_LAYERS, None, "the embedded model")
    path = Path(model).expanduser()
    if path.is_dir():
        return _read_config(path / "config.json") or ModelSize(None, None, str(path))
    if path.suffix == ".gguf":
        return ModelSize(None, None, f"{model} (a .gguf file: no config to read)")
    try:
        hit = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a hub id (a path that does not exist): the loader says why
        return ModelSize(None, None, model)
    if isinstance(hit, str):
        return _read_config(Path(hit)) or ModelSize(None, None, model)
    return ModelSize(None, None, f"{model} (not in the local hub cache)")


@dataclass
class Estimate:
    """The estimated CPU seconds of a plan: ``counts`` (operation -> items), ``seconds``
    (``None`` when the model's size is unknown), ``scale`` (the parameter ratio to the
    embedded model applied to the table; 1 for it) and ``notes`` (what the estimate leaves
    out or assumes)."""

    counts: dict[str, float]
    seconds: float | None
    scale: float | None
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        items = ", ".join(f"{v:,.0f} x {k}" for k, v in self.counts.items() if v)
        where = (f"per-item costs measured on the embedded model on {MEASURED_ON.get('date')}, "
                 f"{MEASURED_ON.get('machine')}, {MEASURED_ON.get('threads')} thread(s)")  # fmt: skip
        if self.seconds is None:
            head = "estimated CPU time: cannot know (the model's size is unknown: " + where + ")"
        else:
            head = f"estimated CPU time: {_duration(self.seconds)} ({where}"
            if self.scale is not None and abs(self.scale - 1) > 1e-9:
                head += f"; scaled x{self.scale:.2f} by the model's parameter count"
            head += ")"
        lines = [head, f"  items: {items or 'none'}"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(
    counts: Mapping[str, float], shape: ModelSize, notes: list[str] | None = None
) -> Estimate:
    """``sum(counts[op] * SECONDS_PER_ITEM[op])``, times the parameter ratio of ``shape`` to
    the embedded model (``seconds`` is ``None`` when ``shape.params`` is unknown for a model
    that is not the embedded one).

    Raises:
        KeyError: an operation that is not in :data:`SECONDS_PER_ITEM`.
    """
    base = sum(float(n) * SECONDS_PER_ITEM[op] for op, n in counts.items())
    ref = _read_config(_embedded_config())
    ref_params = ref.params if ref is not None else None
    if shape.source in {"the embedded model", str(_embedded_config())}:
        scale: float | None = 1.0
    elif shape.params is not None and ref_params:
        scale = shape.params / ref_params
    else:
        scale = None
    seconds = None if scale is None else base * scale
    return Estimate({k: float(v) for k, v in counts.items()}, seconds, scale, list(notes or []))
