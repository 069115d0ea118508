"""The types every layer shares: the model protocol and the hook signatures.

:class:`Model` is what mechlingo needs of a model. TransformerLens 4's ``TransformerBridge``
and the classic ``HookedTransformer`` (TransformerLens 3 and 4) both satisfy it, so every
analysis takes either. TransformerLens 4.3 ships a similar protocol
(``transformer_lens.model_protocol.TransformerLensModel``), but TransformerLens 3, which
mechlingo also supports, has none, and mechlingo reads a few more members (``W_U``,
``tokenizer``, ``hooks``); hence this small one of its own. It is runtime-checkable:
``isinstance(obj, Model)`` checks that the members are present.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

HookFn = Callable[[Tensor, Any], Tensor | None]
"""A forward hook: ``fn(activation, hook) -> replacement or None``."""

FwdHooks = Sequence[tuple[str | Callable[[str], bool], HookFn]]
"""``(hook name or name filter, hook)`` pairs, as TransformerLens's ``fwd_hooks`` takes."""


@runtime_checkable
class Model(Protocol):
    """A TransformerLens model: a ``TransformerBridge`` or a ``HookedTransformer``."""

    @property
    def cfg(self) -> Any:
        """The model's config (``d_model``, ``n_layers``, ``d_mlp``, ...)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer."""
        ...

    @property
    def W_U(self) -> Tensor:
        """The unembedding, ``[d_model, d_vocab]``."""
        ...

    @property
    def hook_dict(self) -> dict[str, Any]:
        """Every hook point by name (``blocks.3.hook_resid_pre``, ...)."""
        ...

    @property
    def blocks(self) -> Any:
        """The transformer blocks, indexable by layer."""
        ...

    def modules(self) -> Any:
        """Every submodule (``torch.nn.Module.modules``)."""
        ...

    def hooks(self, *args: Any, **kwargs: Any) -> Any:
        """A context manager that adds forward hooks and removes them on exit."""
        ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any:
        """A forward pass with temporary hooks."""
        ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> Any:
        """Tokenize text the way the model does (BOS included where it prepends one)."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The forward pass."""
        ...
