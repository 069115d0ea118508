"""The logit lens as a decoder (nostalgebraist 2020): the residual read at each lens entry
goes to the final norm and the unembedding as it is. It is the default decoder and has no
options; the card measures it in its trace stage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.decoders.registry import register_decoder
from mechlingo.core.sites import site_map
from mechlingo.core.types import Model

__all__ = ["LOGIT", "LogitLens"]

#: The logit lens's registered name.
LOGIT = "logit"


@dataclass(frozen=True)
class LogitLens:
    """The logit lens as a decoder: the identity."""

    name: str = LOGIT

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


def _logit(model: Model, **opts: Any) -> LogitLens:
    return LogitLens()


register_decoder(LOGIT, _logit, help="final norm and unembedding (the logit lens)",
                 default=True)  # fmt: skip
