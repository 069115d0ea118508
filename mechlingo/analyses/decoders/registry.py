"""The decoders of the residual stream, declared once: the :class:`Decoder` interface, the
:class:`DecoderSpec` each decoder registers, and the registry every reader of decoder names
uses (the lens, the command line, the cost estimate, the glossary, the palette, the card).

A decoder turns the residual stream read at lens entries into rows that the final norm and
the unembedding read (:func:`mechlingo.kernels.readout.read_logits`). This module names no
decoder: each registers itself in its own module (importing :mod:`mechlingo.analyses.decoders`
registers the shipped ones). A new decoder is one module: a class with ``name``, ``check`` and
``decode`` (``generate`` if it writes continuations) and one call declaring its options::

    register_decoder("blended", Blended, options=[DecoderOption("--blend", "blend", float,
                     BLEND, "weight of the last entry", minimum=0, maximum=1)])

The command line, the estimate, the card and the API then use it (docs/methods/logit-lens.md,
"Adding a decoder")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from jaxtyping import Float
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.viz.palette import register_decoder_color

__all__ = [
    "Decoder",
    "DecoderOption",
    "DecoderSpec",
    "DecoderUse",
    "as_decoder",
    "decoder_entry",
    "decoder_names",
    "decoder_specs",
    "default_decoder",
    "generates",
    "get_decoder",
    "register_decoder",
    "runnable_decoders",
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


def generates(decoder: Decoder) -> bool:
    """Whether ``decoder`` writes continuations (a ``generate`` method and a positive
    ``max_new_tokens``)."""
    return callable(getattr(decoder, "generate", None)) and (
        int(getattr(decoder, "max_new_tokens", 0) or 0) > 0
    )


@dataclass(frozen=True)
class DecoderOption:
    """One option of a decoder, declared once for the command line and the API.

    Attributes:
        flag: its command-line flag (``"--scale"``), added to every command that takes
            ``--decoder``; ``dest`` is the flag's ``args`` attribute.
        keyword: the factory's keyword (``scale``), also the key in the card's
            ``decoders`` budget section.
        type: converts the flag's text (``int``, ``float``, ``str``).
        default: the value when not given (a named constant of the decoder's module);
            ``None`` with ``required``: the decoder cannot run without it.
        help: one line for ``--help`` (the decoder and the default are added).
        why_default: why the default is what it is, shown after it in ``--help``; for a
            ``None`` default, what leaving the option unset means.
        minimum, maximum: the range allowed (numbers), checked before the model loads.
        required: the decoder needs a value (``fix`` says how to get one).
        fix: what to do when a required value is missing.
        missing: why the decoder cannot run without it (the card's reason when its budget
            gives none; default: from ``fix``).
        per_label: the value is ``VALUE`` or ``NAME=VALUE,NAME=VALUE``: one decoder per item,
            labelled ``<decoder>-NAME`` (several tuned lenses side by side).
        validate: called with each value (after ``type``) before the model loads; raises
            :class:`~mechlingo.core.errors.InputError` for a bad one.
    """

    flag: str
    keyword: str
    type: Callable[[str], Any]
    default: Any
    help: str
    why_default: str = ""
    minimum: float | None = None
    maximum: float | None = None
    required: bool = False
    fix: str = ""
    missing: str = ""
    per_label: bool = False
    validate: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if not self.flag.startswith("--") or not self.keyword.isidentifier():
            raise InputError(f"decoder option {self.flag!r}/{self.keyword!r}: the flag starts "
                             "with -- and the keyword is a Python name")  # fmt: skip

    @property
    def dest(self) -> str:
        """The ``args`` attribute of :attr:`flag` (``--patchscope-target`` ->
        ``patchscope_target``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def why_missing(self) -> str:
        """Why the decoder cannot run without this option, and what to do."""
        return self.missing or f"no {self.keyword} given: {self.fix or 'pass ' + self.keyword}"

    def check(self, value: Any) -> Any:
        """``value`` checked (``None`` passes when not required): the range and
        :attr:`validate`.

        Raises:
            InputError: naming the flag and the allowed range.
        """
        if value is None:
            return value
        if self.minimum is not None and not value >= self.minimum:
            raise InputError(f"{self.flag} must be at least {self.minimum:g}, got {value}",
                             where=self.flag)  # fmt: skip
        if self.maximum is not None and not value <= self.maximum:
            raise InputError(f"{self.flag} must be at most {self.maximum:g}, got {value}",
                             where=self.flag)  # fmt: skip
        if self.validate is not None:
            self.validate(value)
        return value


@dataclass(frozen=True)
class DecoderSpec:
    """One registered decoder.

    Attributes:
        name: its name (``--decoder NAME``, ``decoder="NAME"``, the label of its results).
        factory: ``factory(model, **options) -> Decoder``; it receives every declared
            option (its default when not given) and may ignore keywords it does not know.
        color: its palette colour (the shipped decoders' are in
            :data:`mechlingo.viz.palette.DECODER`). help: one line for the command line and
            the glossary.
        options: its :class:`DecoderOption` list.
        generates: it can write continuations (``max_new_tokens`` of its options, per entry).
        layer_passes: forward passes of its own per prompt and lens entry (the dry-run
            estimate; the patchscope runs one target prompt per entry, the logit lens none).
        card_cost: the card's cost of one prompt read at every entry, in items scored under
            ``rank`` (the card's cost unit), when the card's decoders stage runs it.
        default: the decoder when none is named (one registered decoder says so).
    """

    name: str
    factory: Callable[..., Decoder]
    color: str
    help: str = ""
    options: tuple[DecoderOption, ...] = ()
    generates: bool = False
    layer_passes: float = 0.0
    card_cost: float = 1.0
    default: bool = False

    def option_values(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every declared option's value: ``given`` (by keyword) else its default, each
        checked; keywords the spec does not declare pass through unchecked."""
        given = dict(given or {})
        out = {o.keyword: o.check(given.pop(o.keyword, o.default)) for o in self.options}
        return {**out, **given}

    def missing(self, values: Mapping[str, Any]) -> DecoderOption | None:
        """The first required option without a value in ``values`` (``None``: it can run)."""
        return next((o for o in self.options if o.required and values.get(o.keyword) is None),
                    None)  # fmt: skip

    def build(self, model: Model, **options: Any) -> Decoder:
        """The decoder for ``model`` with ``options`` (:meth:`option_values`), checked.

        Raises:
            InputError: a required option is missing, or a value is out of range.
        """
        values = self.option_values(options)
        need = self.missing(values)
        if need is not None:
            raise InputError(f"decoder {self.name!r} needs {need.keyword}= ({need.flag})",
                             fix=need.fix or f"pass {need.keyword}=")  # fmt: skip
        decoder = self.factory(model, **values)
        decoder.check(model)
        return decoder


@dataclass(frozen=True)
class DecoderUse:
    """One decoder as a command runs it: ``label`` (its results' name; ``tuned-en`` for one
    of several tuned lenses), the registered ``name`` and its ``options`` by keyword."""

    label: str
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> DecoderSpec:
        """The registered :class:`DecoderSpec`."""
        return decoder_entry(self.name)

    def build(self, model: Model) -> Decoder:
        """The decoder for ``model`` (:meth:`DecoderSpec.build`)."""
        return self.spec.build(model, **self.options)


_REGISTRY: dict[str, DecoderSpec] = {}


def register_decoder(
    name: str,
    factory: Callable[..., Decoder],
    *,
    color: str | None = None,
    help: str = "",
    options: Iterable[DecoderOption] = (),
    generates: bool = False,
    layer_passes: float = 0.0,
    card_cost: float = 1.0,
    default: bool = False,
) -> DecoderSpec:
    """Register ``factory(model, **options) -> Decoder`` under ``name`` (replacing a decoder
    of that name) with its options and cost (:class:`DecoderSpec`); without ``color`` the
    palette gives it the next unused fallback colour.

    Raises:
        InputError: an empty name, or one with a comma or a space (the command line lists
            decoders comma-separated); an option flag or keyword another decoder declares
            with another meaning; a second default decoder.
    """
    if not name or any(c in name for c in ", "):
        raise InputError(f"decoder name {name!r} must be non-empty, without commas or spaces")
    opts = tuple(options)
    for other in _REGISTRY.values():
        if other.name == name:
            continue
        if default and other.default:
            raise InputError(f"decoder {name!r}: {other.name!r} is already the default decoder")
        for o in opts:
            clash = [p for p in other.options if (p.flag == o.flag) != (p.keyword == o.keyword)
                     or (p.flag == o.flag and p != o)]  # fmt: skip
            if clash:
                raise InputError(f"decoder {name!r}: option {o.flag} ({o.keyword}) clashes "
                                 f"with {other.name!r}'s {clash[0].flag} ({clash[0].keyword})",
                                 fix="give the option a flag and keyword of its own")  # fmt: skip
    spec = DecoderSpec(name, factory, register_decoder_color(name, color), help, opts,
                       generates, float(layer_passes), float(card_cost), default)  # fmt: skip
    _REGISTRY[name] = spec
    return spec


def unregister_decoder(name: str) -> None:
    """Remove a registered decoder (its palette colour stays: figures already drawn agree)."""
    _REGISTRY.pop(name, None)


def decoder_names() -> list[str]:
    """The registered decoder names, in registration order (the shipped ones first)."""
    return list(_REGISTRY)


def decoder_specs() -> list[DecoderSpec]:
    """The registered decoders, in registration order."""
    return list(_REGISTRY.values())


def default_decoder() -> str:
    """The name of the decoder used when none is named (the one registered with
    ``default=True``; else the first registered).

    Raises:
        InputError: no decoder is registered.
    """
    if not _REGISTRY:
        raise InputError("no decoder is registered", fix="import mechlingo.analyses.decoders")
    return next((s.name for s in _REGISTRY.values() if s.default), next(iter(_REGISTRY)))


def runnable_decoders() -> list[str]:
    """The registered decoders that run with their defaults (no required option)."""
    return [s.name for s in _REGISTRY.values() if s.missing(s.option_values()) is None]


def decoder_entry(name: str) -> DecoderSpec:
    """The registered :class:`DecoderSpec` of ``name``.

    Raises:
        InputError: an unknown name.
    """
    if name not in _REGISTRY:
        raise InputError(f"unknown decoder {name!r}; choose from {decoder_names()}")
    return _REGISTRY[name]


def get_decoder(name: str, model: Model, **opts: Any) -> Decoder:
    """The decoder registered as ``name``, built for ``model`` with ``opts`` (its declared
    options by keyword, the defaults for the others) and checked against it.

    Raises:
        InputError: an unknown name, an option out of range, or a required one missing.
        ModelMismatchError: a decoder fitted to another model (a tuned lens).
    """
    return decoder_entry(name).build(model, **opts)


def as_decoder(decoder: str | Decoder | None, model: Model, **opts: Any) -> Decoder:
    """A decoder from what callers pass: ``None`` is the default decoder (the logit lens), a
    name goes through :func:`get_decoder` with ``opts``, an object is checked against
    ``model`` and returned.

    Raises:
        InputError: an unknown name, or an object without ``decode``.
    """
    if decoder is None or isinstance(decoder, str):
        return get_decoder(decoder or default_decoder(), model, **opts)
    if not callable(getattr(decoder, "decode", None)):
        raise InputError(f"{type(decoder).__name__} is no decoder: it has no decode()")
    check = getattr(decoder, "check", None)
    if callable(check):
        check(model)
    return decoder
