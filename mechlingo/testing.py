"""Tiny random models for tests, benchmarks and notebooks: the one builder.

:func:`build_tiny_folder` writes a transformers folder offline (a small config, random
weights fixed by a seed, a tokenizer trained on a few multilingual sentences) and
:func:`tiny_model` builds one and loads it with :func:`mechlingo.core.models.load_model`, so
it exercises the real loading path. Their outputs mean nothing. ``family=None`` gives the
tests' default (Gemma 3, ``d_model`` 64, a byte-level tokenizer); a key of
:data:`mechlingo.core.families.FAMILIES` gives that family's tiny model with its tokenizer
convention (:func:`build_tokenizer`). :data:`TINY` says how each is built, read from each
family's :attr:`~mechlingo.core.families.Family.tiny` record. ``docs/models.md`` ("Building
the tiny models") has the sizes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.core.families import FAMILIES
from mechlingo.core.models import load_model
from mechlingo.core.types import Model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["TINY", "Sizes", "TinySpec", "build_tiny_folder", "build_tokenizer", "tiny_model"]

TokenizerKind = Literal["bytelevel", "gpt2", "qwen", "metaspace", "xglm", "nospace", "spacetoken"]

# The tiny models' training text: every script the bundled facts use, and the test prompts.
_CORPUS = (
    "The capital of Italy is the city of Rome. The capital of France is Paris. "
    "La capitale de l'Italie est Rome. La capitale de la France est Paris. "
    "Die Hauptstadt von Italien ist Rom. La capital de Italia es Roma. "
    "A capital da Itália é Roma. Столица Италии — Рим. 意大利的首都是罗马。 "
    "イタリアの首都はローマです。 이탈리아의 수도는 로마입니다. عاصمة إيطاليا هي روما. "
    "इटली की राजधानी रोम है। English: Rome French: Rome German: Rom "
    "the cat sat on the mat. hello world. a dog ran to the park. it is raining today again. "
    "el gato. hola mundo que tal. un perro grande y feo. llueve mucho hoy. "
    "le chat. bonjour. un chien noir. il pleut beaucoup aujourd'hui."
)


# The tests' default model's training text (a subset of the above, as it always was).
_TEST_CORPUS = (
    "The capital of Italy is the city of Rome. The capital of France is Paris. "
    "La capitale de l'Italie est Rome. La capitale de la France est Paris. "
    "Die Hauptstadt von Italien ist Rom. La capital de Italia es Roma. "
    "A capital da Itália é Roma. Столица Италии — Рим. 意大利的首都是罗马。 "
    "イタリアの首都はローマです。 이탈리아의 수도는 로마입니다. عاصمة إيطاليا هي روما. "
    "इटली की राजधानी रोम है। English: Rome French: Rome German: Rom"
)


# --------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------


def build_tokenizer(
    kind: TokenizerKind, *, vocab_size: int = 400, corpus: str = _CORPUS
) -> PreTrainedTokenizerFast:
    """A small fast tokenizer trained offline on a few multilingual sentences (``corpus``).

    Kinds (each mirrors a convention of real multilingual models):

    * ``"bytelevel"``: byte-level BPE with the ``Ġ`` leading-space marker (GPT-2, BLOOM,
      Llama 3, Cohere); ``<bos>``/``<eos>``/``<pad>`` specials; TransformerLens adds BOS.
    * ``"gpt2"``: byte-level BPE whose only special token ``<|endoftext|>`` is BOS, EOS and
      padding at once (GPT-2, Pythia).
    * ``"qwen"``: byte-level BPE with no BOS token at all (Qwen 2/2.5/3); TransformerLens
      substitutes EOS when asked for one.
    * ``"metaspace"``: SentencePiece-style ``▁`` marker, and the tokenizer itself prepends
      ``<s>`` (Llama 2, Mistral, Gemma): BOS is added by the tokenizer, not by
      TransformerLens.
    * ``"xglm"``: ``▁`` marker, and the tokenizer prepends ``</s>`` (the EOS token) as its
      BOS, as XGLM does.
    * ``"nospace"``: no leading-space marker at all: words are split on whitespace and the
      spaces dropped, so ``" Rome"`` and ``"Rome"`` are the same token and decoded tokens
      carry no space.
    * ``"spacetoken"``: no leading-space marker either, but the space is kept as a token of
      its own: ``" Rome"`` is ``[" ", "Rome"]`` (character- and byte-level models).
    """
    from transformers import PreTrainedTokenizerFast

    texts = [corpus] * 4
    alphabet = sorted(set(corpus) - {" "})
    if kind in ("bytelevel", "gpt2", "qwen"):
        specials = {
            "bytelevel": ["<pad>", "<eos>", "<bos>"],
            "gpt2": ["<|endoftext|>"],
            "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        }[kind]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        if kind == "bytelevel":
            kw = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        elif kind == "gpt2":
            kw = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        else:
            kw = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
        return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    if kind in ("metaspace", "xglm"):
        specials = ["<pad>", "</s>", "<s>", "<unk>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=alphabet + ["▁"],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        bos = "<s>" if kind == "metaspace" else "</s>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token=bos,
            eos_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
        )
    if kind in ("nospace", "spacetoken"):
        specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        if kind == "nospace":
            tok.pre_tokenizer = pre_tokenizers.Whitespace()
        else:
            tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
            tok.decoder = decoders.Fuse()
            alphabet = [*alphabet, " "]
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=alphabet,
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<bos>",
            eos_token="<eos>",
            pad_token="<pad>",
            unk_token="<unk>",
        )
    raise InputError(f"unknown tokenizer kind {kind!r}")


def _special_ids(tok: Any) -> dict[str, int]:
    out = {}
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tok, key, None)
        if value is not None:
            out[key] = int(value)
    return out


# --------------------------------------------------------------------------------------
# Sizes and configs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """The sizes of a tiny model (and the two that follow from them: ``n_kv_heads``,
    ``head_dim``)."""

    n_layers: int = 2
    d_model: int = 32
    d_mlp: int = 64
    n_heads: int = 4
    n_ctx: int = 128

    @property
    def n_kv_heads(self) -> int:
        """Key-value heads of grouped-query attention: half the query heads."""
        return self.n_heads // 2

    @property
    def head_dim(self) -> int:
        """The width of one head: ``d_model / n_heads``."""
        return self.d_model // self.n_heads


def _alternating(n_layers: int) -> list[str]:
    """Sliding-window and full attention layers in turn (the first slides)."""
    return [("sliding_attention", "full_attention")[i % 2] for i in range(n_layers)]


def _test_gemma3(v: int, ids: dict[str, Any], s: Sizes) -> Any:
    """The tests' default model: Gemma 3 with full attention and a window longer than any
    test prompt."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=v,
        hidden_size=s.d_model,
        intermediate_size=s.d_mlp,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        num_key_value_heads=max(1, s.n_heads // 2),
        head_dim=s.head_dim,
        max_position_embeddings=s.n_ctx,
        sliding_window=64,
        layer_types=["full_attention"] * s.n_layers,
        **ids,
    )


@dataclass(frozen=True)
class _Config:
    """A tiny model's transformers config: the class ``name`` built from the vocabulary
    size, the tokenizer's special ids and the sizes under the config's ``names`` for them
    (``{size: config key}``, a size being a :class:`Sizes` attribute), plus ``extra``; with
    ``sliding``, sliding-window and full attention layers in turn, with a window of 4 tokens
    (shorter than the test prompts: the local layers really slide)."""

    name: str
    names: Mapping[str, str]
    extra: Mapping[str, Any]
    sliding: bool

    def __call__(self, v: int, ids: dict[str, Any], s: Sizes) -> Any:
        import transformers

        kw: dict[str, Any] = {"vocab_size": v}
        kw |= {key: getattr(s, size) for size, key in self.names.items()}
        if self.sliding:
            kw |= {"sliding_window": 4, "layer_types": _alternating(s.n_layers)}
        return getattr(transformers, self.name)(**(kw | dict(ids) | dict(self.extra)))


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Spread the random weights (so predictions are not flat) and move every norm scale and
    bias off its initial value (so a misplaced norm or a dropped bias changes the numbers)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
            if p.ndim >= 2:
                p.copy_(0.2 * noise)
            else:
                p.add_(0.1 * noise)


def _spread(model: torch.nn.Module, seed: int) -> None:
    """Spread the random matrices (``N(0, 0.2)``, from the global generator just seeded) so
    that the tests' model's predictions are not all flat."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)


# --------------------------------------------------------------------------------------
# The builder
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinySpec:
    """How one tiny model is built.

    Attributes:
        tokenizer: the tokenizer kind (see :func:`build_tokenizer`).
        config: ``config(vocab_size, special_ids, sizes) -> PretrainedConfig``.
        architecture: the transformers class written to ``config.json``.
        sizes: the default sizes.
        vocab_size: the tokenizer's vocabulary size.
        corpus: the tokenizer's training text.
        init: ``init(model, seed)``, the weights after ``from_config`` (seeded with ``seed``).
    """

    tokenizer: TokenizerKind
    config: Callable[[int, dict[str, int], Sizes], Any]
    architecture: str
    sizes: Sizes = field(default_factory=Sizes)
    vocab_size: int = 400
    corpus: str = _CORPUS
    init: Callable[[torch.nn.Module, int], None] = _randomize


_DEFAULT = TinySpec(
    tokenizer="bytelevel",
    config=_test_gemma3,
    architecture="Gemma3ForCausalLM",
    sizes=Sizes(n_layers=2, d_model=64, d_mlp=128, n_heads=4, n_ctx=512),
    vocab_size=420,
    corpus=_TEST_CORPUS,
    init=_spread,
)


def _family_spec(name: str) -> TinySpec:
    """The tiny model of a registered family, from its :attr:`Family.tiny` record."""
    family = FAMILIES[name]
    if family.tiny is None:
        raise KeyError(name)
    t = family.tiny
    config = _Config(t.config, t.names, t.extra, t.sliding)
    return TinySpec(tokenizer=t.tokenizer, config=config,  # type: ignore[arg-type]
                    architecture=family.architecture)  # fmt: skip


class _Configs(Mapping[str, tuple[TokenizerKind, _Config]]):
    """Family -> (tokenizer kind, config): a view of the family registry."""

    def __getitem__(self, name: str) -> tuple[TokenizerKind, _Config]:
        spec = _family_spec(name)
        return spec.tokenizer, spec.config  # type: ignore[return-value]

    def __iter__(self) -> Iterator[str]:
        return (name for name, f in FAMILIES.items() if f.tiny is not None)

    def __len__(self) -> int:
        return sum(f.tiny is not None for f in FAMILIES.values())


class _Tiny(Mapping[str | None, TinySpec]):
    """``None`` -> the tests' default model, family name -> its tiny model (read from the
    family registry on every lookup)."""

    def __getitem__(self, name: str | None) -> TinySpec:
        return _DEFAULT if name is None else _family_spec(name)

    def __iter__(self) -> Iterator[str | None]:
        return iter([None, *_CONFIGS])

    def __len__(self) -> int:
        return 1 + len(_CONFIGS)


_CONFIGS: Mapping[str, tuple[TokenizerKind, _Config]] = _Configs()

TINY: Mapping[str | None, TinySpec] = _Tiny()
"""How each tiny model is built: ``None`` is the tests' default model, the other keys are
the families of :data:`mechlingo.core.families.FAMILIES` with a
:attr:`~mechlingo.core.families.Family.tiny` record."""


#: A chat template in the style of Gemma's turn markers, for tiny test models
#: (``build_tiny_folder(..., chat_template=TINY_CHAT_TEMPLATE)``).
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_tiny_folder(
    folder: str | os.PathLike[str],
    family: str | None = None,
    *,
    seed: int = SEED,
    n_layers: int | None = None,
    d_model: int | None = None,
    d_mlp: int | None = None,
    n_heads: int | None = None,
    chat_template: str | None = None,
) -> Path:
    """Write a tiny random model and its tokenizer to ``folder``; its path.

    Args:
        folder: where (created if missing).
        family: ``None`` for the tests' default model (Gemma 3, ``d_model`` 64), or a key of
            :data:`mechlingo.core.families.FAMILIES` for that family's tiny model.
        seed: fixes the weights; the caller's global torch generator is left as it was.
        n_layers, d_model, d_mlp, n_heads: override the model's default sizes.
        chat_template: a Jinja chat template saved with the tokenizer (e.g.
            :data:`TINY_CHAT_TEMPLATE`), for tests of chat-model prompts.

    Raises:
        InputError: an unknown family.
    """
    from transformers import AutoModelForCausalLM

    if family not in TINY:
        raise InputError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    spec = TINY[family]
    given = {"n_layers": n_layers, "d_model": d_model, "d_mlp": d_mlp, "n_heads": n_heads}
    sizes = replace(spec.sizes, **{k: v for k, v in given.items() if v is not None})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec.tokenizer, vocab_size=spec.vocab_size, corpus=spec.corpus)
    if chat_template is not None:
        tok.chat_template = chat_template
    config = spec.config(len(tok), _special_ids(tok), sizes)
    config.architectures = [spec.architecture]
    with torch.random.fork_rng(devices=[]):  # the seed fixes the weights, not the caller's
        torch.manual_seed(seed)
        hf_model = AutoModelForCausalLM.from_config(config)
        spec.init(hf_model, seed)
    hf_model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_model(
    folder: str | os.PathLike[str] | None = None,
    family: str | None = None,
    *,
    seed: int = SEED,
    chat_template: str | None = None,
    **sizes: int,
) -> Model:
    """Build (in ``folder``, or a temporary folder) and load a tiny random model on the CPU;
    :func:`build_tiny_folder` says what it is. Its ``cfg.model_name`` is
    ``"mechlingo-tiny-gemma3"`` for the default model, ``"mechlingo-tiny-<family>"`` otherwise
    (``chat_template``: see :func:`build_tiny_folder`)."""
    if folder is None:
        folder = tempfile.mkdtemp(prefix="mechlingo-tiny-")
    path = build_tiny_folder(folder, family, seed=seed, chat_template=chat_template, **sizes)
    model = load_model(path, device="cpu")
    model.cfg.model_name = f"mechlingo-tiny-{family or 'gemma3'}"
    return model
