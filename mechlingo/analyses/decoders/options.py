"""How a tuned lens is trained, as one frozen options object.

:class:`TrainingOptions` holds the keyword arguments of
:func:`~mechlingo.analyses.decoders.tuned_lens.train_tuned_lens` (its defaults are that
function's), checked when it is made; :func:`~mechlingo.analyses.decoders.run.run_tuned_lens`
and ``mechlingo tuned-lens`` pass it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from mechlingo.core.defaults import PROGRESS, SEED
from mechlingo.core.errors import InputError

__all__ = ["TrainingOptions"]


@dataclass(frozen=True)
class TrainingOptions:
    """The settings of one tuned-lens training (their meaning:
    :func:`~mechlingo.analyses.decoders.tuned_lens.train_tuned_lens`).

    Attributes:
        steps: optimizer steps (at most). max_seconds: stop earlier after this long.
        texts_per_step: texts per step over all ranks. lr: Adam learning rate.
        warmup: linear warm-up steps. max_tokens: tokens per text.
        vocab_sample: ``None`` (exact), an int (sampled remainder) or ``"auto"``.
        target_top_k: target tokens kept exactly under the sampled objective.
        chunk_rows: tokens per unembedding pass. seed: text order and samples.
        progress: show a progress bar.
    """

    steps: int = 40
    max_seconds: float | None = None
    texts_per_step: int = 8
    lr: float = 1e-3
    warmup: int = 4
    max_tokens: int = 64
    vocab_sample: int | str | None = "auto"
    target_top_k: int = 64
    chunk_rows: int = 32
    seed: int = SEED
    progress: bool = PROGRESS

    def __post_init__(self) -> None:
        for name, flag in (("steps", "--steps"), ("texts_per_step", "--texts-per-step"),
                           ("max_tokens", "--max-tokens"), ("chunk_rows", None),
                           ("target_top_k", None), ("warmup", None)):  # fmt: skip
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                via = f" ({flag})" if flag else ""
                raise InputError(f"{name}{via} must be an integer of at least 1, got {v!r}")
        if not self.lr > 0:
            raise InputError(f"lr (--lr) must be above 0, got {self.lr}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise InputError(f"max_seconds (--max-seconds) must be above 0, got {self.max_seconds}")
        vs = self.vocab_sample
        if not (vs is None or vs == "auto" or (isinstance(vs, int) and vs >= 1)):
            raise InputError(f"vocab_sample {vs!r}: pass None (exact), 'auto' or an int >= 1")

    @classmethod
    def of(cls, given: TrainingOptions | Mapping[str, Any] | None) -> TrainingOptions:
        """``given`` as options: itself, the defaults (``None``) or a mapping of keywords
        (a key that is no setting is refused, naming the settings)."""
        if given is None or isinstance(given, TrainingOptions):
            return given or cls()
        names = {f.name for f in fields(cls)}
        bad = sorted(set(given) - names)
        if bad:
            raise InputError(f"unknown tuned-lens settings {bad}: pass some of {sorted(names)}")
        return cls(**dict(given))

    def kw(self) -> dict[str, Any]:
        """The settings as a dict (their names are the fields)."""
        return asdict(self)
