"""The decoders of the residual stream, declared once: the :class:`Decoder` interface and the
registry every reader of decoder names uses (the lens, the command line, the glossary, the
palette, the card).

A decoder turns the residual stream read at lens entries into rows that the final norm and
the unembedding read (:func:`mechlingo.kernels.readout.read_logits`): the logit lens is the
identity (:class:`LogitLens`), a tuned lens applies its translators, a patchscope runs the
states through an identity prompt. A new decoder is one class with ``name``, ``check`` and
``decode`` (``generate`` if it writes continuations) and one line::

    register_decoder("rotated", lambda model, **opts: Rotated(model))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.decoders.patchscope import Patchscope
from mechlingo.analyses.decoders.tuned_lens import TunedLens, load_tuned_lens
from mechlingo.core.errors import InputError
from mechlingo.core.sites import site_map
from mechlingo.core.types import Model
from mechlingo.viz.palette import register_decoder_color

__all__ = [
    "BUILTIN_DECODERS",
    "Decoder",
    "DecoderEntry",
    "LogitLens",
    "as_decoder",
    "decoder_entry",
    "decoder_names",
    "generates",
    "get_decoder",
    "register_decoder",
    "unregister_decoder",
]


@runtime_checkable
class Decoder(Protocol):
    """What the lens kernels call on a decoder.

    ``name`` labels its results; ``check(model)`` raises
    :class:`~mechlingo.core.errors.InputError` (or a
    :class:`~mechlingo.core.errors.ModelMismatchError`) when the decoder does not fit ``model``;
    ``decode(model, entries, acts, langs)`` maps the ``[entry, row, d_model]`` residuals read
    at ``entries`` (rows in the languages ``langs``) to rows of the same shape, read next
    through the final norm and unembedding. A decoder that also writes continuations has
    ``generate(model, entries, acts, langs) -> [entry][row] strings`` and a positive
    ``max_new_tokens`` (:func:`generates`)."""

    @property
    def name(self) -> str: ...

    def check(self, model: Model) -> None: ...

    def decode(
        self,
        model: Model,
        entries: Sequence[int],
        acts: Float[Tensor, "entry row d_model"],
        langs: Sequence[str],
    ) -> Float[Tensor, "entry row d_model"]: ...


@dataclass(frozen=True)
class LogitLens:
    """The logit lens as a decoder: the identity (the residual goes to the final norm and the
    unembedding as it is; nostalgebraist 2020)."""

    name: str = "logit"

    def check(self, model: Model) -> None:
        """Every model with the block stack's residual hooks fits (else a ``SiteError``)."""
        site_map(model)

    def decode(
        self,
        model: Model,
        entries: Sequence[int],
        acts: Float[Tensor, "entry row d_model"],
        langs: Sequence[str],
    ) -> Float[Tensor, "entry row d_model"]:
        """``acts`` unchanged."""
        return acts


def generates(decoder: Decoder) -> bool:
    """Whether ``decoder`` writes continuations (a ``generate`` method and a positive
    ``max_new_tokens``)."""
    return callable(getattr(decoder, "generate", None)) and (
        int(getattr(decoder, "max_new_tokens", 0) or 0) > 0
    )


@dataclass(frozen=True)
class DecoderEntry:
    """One registered decoder: ``factory(model, **opts)`` builds it, ``color`` is its palette
    colour, ``help`` one line for the command line and the glossary."""

    name: str
    factory: Callable[..., Decoder]
    color: str
    help: str = ""


_REGISTRY: dict[str, DecoderEntry] = {}


def register_decoder(
    name: str, factory: Callable[..., Decoder], *, color: str | None = None, help: str = ""
) -> DecoderEntry:
    """Register ``factory(model, **opts) -> Decoder`` under ``name`` (replacing an entry of
    that name); without ``color`` the palette gives it the next unused fallback colour.

    Raises:
        InputError: an empty name, or one with a comma or a space (the command line lists
            decoders comma-separated).
    """
    if not name or any(c in name for c in ", "):
        raise InputError(f"decoder name {name!r} must be non-empty, without commas or spaces")
    entry = DecoderEntry(name, factory, register_decoder_color(name, color), help)
    _REGISTRY[name] = entry
    return entry


def unregister_decoder(name: str) -> None:
    """Remove a registered decoder (its palette colour stays: figures already drawn agree)."""
    _REGISTRY.pop(name, None)


def decoder_names() -> list[str]:
    """The registered decoder names, in registration order (built-ins first)."""
    return list(_REGISTRY)


def decoder_entry(name: str) -> DecoderEntry:
    """The registry entry of ``name``.

    Raises:
        InputError: an unknown name.
    """
    if name not in _REGISTRY:
        raise InputError(f"unknown decoder {name!r}; choose from {decoder_names()}")
    return _REGISTRY[name]


def get_decoder(name: str, model: Model, **opts: Any) -> Decoder:
    """The decoder registered as ``name``, built for ``model`` with ``opts`` (each factory
    takes the options it knows and ignores the others) and checked against it.

    Raises:
        InputError: an unknown name, or options the decoder needs are missing.
        ModelMismatchError: a decoder fitted to another model (a tuned lens).
    """
    decoder = decoder_entry(name).factory(model, **opts)
    decoder.check(model)
    return decoder


def as_decoder(decoder: str | Decoder | None, model: Model, **opts: Any) -> Decoder:
    """A decoder from what callers pass: ``None`` is the logit lens, a name goes through
    :func:`get_decoder`, an object is checked against ``model`` and returned.

    Raises:
        InputError: an unknown name, or an object without ``decode``.
    """
    if decoder is None:
        return LogitLens()
    if isinstance(decoder, str):
        return get_decoder(decoder, model, **opts)
    if not callable(getattr(decoder, "decode", None)):
        raise InputError(f"{type(decoder).__name__} is no decoder: it has no decode()")
    check = getattr(decoder, "check", None)
    if callable(check):
        check(model)
    return decoder


# --------------------------------------------------------------------------------------
# The built-in decoders
# --------------------------------------------------------------------------------------


def _logit(model: Model, **opts: Any) -> LogitLens:
    return LogitLens()


def _tuned(
    model: Model, *, tuned_lens: TunedLens | str | Path | None = None, **opts: Any
) -> TunedLens:
    if tuned_lens is None:
        raise InputError(
            "decoder 'tuned' needs a tuned lens",
            fix="pass tuned_lens= (a TunedLens or a saved folder; train one with "
            "`mechlingo tuned-lens --out DIR`)",
        )
    if isinstance(tuned_lens, TunedLens):
        return tuned_lens
    return load_tuned_lens(tuned_lens, model)


def _patchscope(
    model: Model,
    *,
    patchscope: Patchscope | None = None,
    target: str | None = None,
    max_new_tokens: int = 0,
    **opts: Any,
) -> Patchscope:
    if patchscope is not None:
        return patchscope
    return Patchscope(target=target, max_new_tokens=max_new_tokens)


register_decoder("logit", _logit, help="final norm and unembedding (the logit lens)")
register_decoder("tuned", _tuned, help="a tuned lens's affine translator first (--tuned-lens)")
register_decoder("patchscope", _patchscope, help="patched into an identity target prompt")

#: The decoders mechlingo ships (the card's claims name them).
BUILTIN_DECODERS = tuple(decoder_names())
