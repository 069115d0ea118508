"""The shared defaults of the options that many functions and commands take, each written once.

A function, an options dataclass or a flag that takes ``batch_size``, ``max_new_tokens``,
``cache`` (the key-value cache), ``early_stop``, ``seed`` or ``progress`` defaults to the
constant here; one that deliberately differs names its own constant (``STEER_*``) and says
why in its ``--help``. ``tests/system/test_options.py`` reads every public signature and options
class and fails on a default that disagrees without a stated reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from mechlingo.core.errors import InputError

__all__ = [
    "BATCH_SIZE",
    "CIRCUIT_PROMPTS",
    "CONTROL_SEEDS",
    "EARLY_STOP",
    "KV_CACHE",
    "MAX_NEW_TOKENS",
    "PROGRESS",
    "SAMPLE_NEW_TOKENS",
    "SEED",
    "STEER_BATCH_SIZE",
    "STEER_MAX_NEW_TOKENS",
    "check_seeds",
]

#: prompts per forward pass
BATCH_SIZE = 16
#: correctly answered prompts per language a measured circuit is scored on (`mechlingo
#: circuit`, `mechlingo trace`): the fewest whose fact-clustered intervals the circuit docs
#: accept; prompts without an equal-length partner drop out and are counted
CIRCUIT_PROMPTS = 20
#: greedy tokens of fact scoring: 99.4% of the 12,960 bundled answers (with a leading space)
#: take at most 8 tokens of the embedded tokenizer
MAX_NEW_TOKENS = 8
#: decode with a key-value cache where the model supports it (the same tokens as without)
KV_CACHE = True
#: stop decoding a fact once its verdict is final (the same verdicts, in less time)
EARLY_STOP = True
#: the seed of every draw that no flag sets
SEED = 0
#: progress bars are off in library calls (the commands turn them on unless ``--quiet``)
PROGRESS = False
#: the steering protocol's greedy tokens: 99% of the bundled capitals take at most 6 tokens,
#: and every condition, seed and sweep setting generates for every prompt
STEER_MAX_NEW_TOKENS = 6
#: the steering protocol's batch: its prompts are short and every condition scores all of them
STEER_BATCH_SIZE = 64
#: the seeds of the random controls (one norm-matched random vector per seed and population):
#: three, the fewest whose spread the repair protocol reports
CONTROL_SEEDS = (0, 1, 2)
#: tokens of each sample drawn from BOS (the k curve's output language)
SAMPLE_NEW_TOKENS = 20


def check_seeds(seeds: Iterable[int], *, what: str = "seeds", fix: str = "") -> list[int]:
    """``seeds`` as a list of ints; an :class:`~mechlingo.core.errors.InputError` naming
    ``what`` (e.g. a flag) when there is none (the random controls need at least one)."""
    out = [int(s) for s in seeds]
    if not out:
        flag = what.startswith("--")
        raise InputError(
            f"{what} needs at least one seed (3 or more advised)",
            where=what if flag else None,
            fix=fix or (f"give e.g. {what} 0,1,2" if flag else f"pass e.g. {what}=(0, 1, 2)"),
        )
    return out
