"""Model families: which architectures mechlingo supports, and tiny random models of each.

mechlingo makes assumptions about where things sit in a model: the final norm (and any logit
soft-cap) the logit lens reads through, the residual hooks between blocks, the MLP input of
the down projection (the "neuron" of the expert statistics), the BOS convention. Those differ
between families, so every family in :data:`FAMILIES` is checked in CI on a tiny random model
(``tests/test_families.py``): sites, lens against TransformerLens's logit lens and the model's
own output, padded batches against one-by-one runs, patching against TransformerLens's
patching, interventions, hook clean-up, expert statistics and alignment embeddings against
hooks on the original transformers modules. ``docs/models.md`` has the table.

:data:`REFUSED` lists architectures that TransformerLens 4 can load but whose numbers would
mean something else in mechlingo (encoder-decoders, encoders, state-space and hybrid
models);
:func:`mechlingo.core.models.load_model` refuses them by name. An architecture in neither list
loads with a warning that it is unchecked.

The builders here (:func:`build_family_folder`, :func:`build_tokenizer`) write a transformers
folder offline: a small config with a fixed seed, random weights, and a tokenizer trained on a
few multilingual sentences. Their outputs mean nothing; they exercise the real loading path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from mechlingo.core.errors import InputError
from mechlingo.core.types import Model

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


# --------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------


def build_tokenizer(kind: TokenizerKind, *, vocab_size: int = 400) -> Any:
    """A small fast tokenizer trained offline on a few multilingual sentences.

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

    corpus = [_CORPUS] * 4
    alphabet = sorted(set(_CORPUS) - {" "})
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
        tok.train_from_iterator(corpus, trainer)
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
        tok.train_from_iterator(corpus, trainer)
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
        tok.train_from_iterator(corpus, trainer)
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
# Families
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One model family as mechlingo supports it.

    Attributes:
        name: short name (``"llama"``).
        architecture: the transformers class named in ``config.json`` (``architectures``).
        examples: real checkpoints of the family a multilingual researcher uses.
        tokenizer: the tokenizer kind of its tiny model (see :func:`build_tokenizer`).
        parallel: attention and MLP read the same residual (no ``resid_mid`` site).
        gated_mlp: the MLP is ``down(act(gate(x)) * up(x))``; ``mlp_post`` is then the
            product ``act(gate(x)) * up(x)``, the input of the down projection.
        final_norm: what the logit lens reads through before the unembedding.
        notes: known differences from the Gemma 3 default, for ``docs/models.md``.
        config: ``config(vocab_size, special_ids) -> PretrainedConfig`` of the tiny model.
    """

    name: str
    architecture: str
    examples: str
    tokenizer: TokenizerKind
    parallel: bool
    gated_mlp: bool
    final_norm: str
    notes: str
    config: Callable[[int, dict[str, int]], Any]


D_MODEL, D_MLP, N_LAYERS, N_HEADS, N_CTX = 32, 64, 2, 4, 128


def _rope_kw(v: int, ids: dict[str, int], **extra: Any) -> dict[str, Any]:
    kw = dict(
        vocab_size=v,
        hidden_size=D_MODEL,
        intermediate_size=D_MLP,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_HEADS // 2,
        max_position_embeddings=N_CTX,
        **ids,
    )
    kw.update(extra)
    return kw


def _llama(v: int, ids: dict[str, int]) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**_rope_kw(v, ids, tie_word_embeddings=False))


def _mistral(v: int, ids: dict[str, int]) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**_rope_kw(v, ids, sliding_window=None, tie_word_embeddings=False))


def _qwen2(v: int, ids: dict[str, int]) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**_rope_kw(v, ids, tie_word_embeddings=True))


def _qwen3(v: int, ids: dict[str, int]) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_rope_kw(v, ids, head_dim=D_MODEL // N_HEADS, tie_word_embeddings=True))


def _gemma(v: int, ids: dict[str, int]) -> Any:
    from transformers import GemmaConfig

    return GemmaConfig(**_rope_kw(v, ids, num_key_value_heads=1, head_dim=D_MODEL // N_HEADS))


def _gemma2(v: int, ids: dict[str, int]) -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(
        **_rope_kw(
            v,
            ids,
            head_dim=D_MODEL // N_HEADS,
            sliding_window=4,  # shorter than the test prompts: the local layer really slides
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=3.0,  # small, so the cap really bends the logits
            attn_logit_softcapping=5.0,
        )
    )


def _gemma3(v: int, ids: dict[str, int]) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_rope_kw(
            v,
            ids,
            head_dim=D_MODEL // N_HEADS,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        )
    )


def _bloom(v: int, ids: dict[str, int]) -> Any:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=v, hidden_size=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS, **ids)


def _cohere(v: int, ids: dict[str, int]) -> Any:
    from transformers import CohereConfig

    return CohereConfig(**_rope_kw(v, ids, logit_scale=0.5, tie_word_embeddings=True))


def _gpt2(v: int, ids: dict[str, int]) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=v, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS, n_positions=N_CTX, **ids
    )


def _neox(v: int, ids: dict[str, int]) -> Any:
    from transformers import GPTNeoXConfig

    kw = _rope_kw(v, ids, rotary_pct=0.5, tie_word_embeddings=False)
    kw.pop("num_key_value_heads")
    return GPTNeoXConfig(**kw)


def _xglm(v: int, ids: dict[str, int]) -> Any:
    from transformers import XGLMConfig

    return XGLMConfig(
        vocab_size=v,
        d_model=D_MODEL,
        ffn_dim=D_MLP,
        num_layers=N_LAYERS,
        attention_heads=N_HEADS,
        max_position_embeddings=N_CTX,
        **ids,
    )


def _phi3(v: int, ids: dict[str, int]) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**_rope_kw(v, ids, tie_word_embeddings=False))


def _olmo2(v: int, ids: dict[str, int]) -> Any:
    from transformers import Olmo2Config

    return Olmo2Config(**_rope_kw(v, ids, tie_word_embeddings=False))


def _falcon(v: int, ids: dict[str, int]) -> Any:
    from transformers import FalconConfig

    return FalconConfig(
        vocab_size=v,
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        **ids,
    )


def _cohere2(v: int, ids: dict[str, int]) -> Any:
    from transformers import Cohere2Config

    return Cohere2Config(
        **_rope_kw(
            v,
            ids,
            logit_scale=0.5,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=True,
        )
    )


def _stablelm(v: int, ids: dict[str, int]) -> Any:
    from transformers import StableLmConfig

    return StableLmConfig(**_rope_kw(v, ids, partial_rotary_factor=0.5, tie_word_embeddings=False))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "gemma3",
            "Gemma3ForCausalLM",
            "google/gemma-3-270m (the embedded default), gemma-3-1b",
            "bytelevel",
            False,
            True,
            "RMSNorm (scale 1 + w)",
            "Embeddings scaled by sqrt(d_model); post-attention and post-MLP norms, so "
            "attn_out/mlp_out are read after them; local sliding-window layers.",
            _gemma3,
        ),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            "google/gemma-2-2b, gemma-2-9b",
            "metaspace",
            False,
            True,
            "RMSNorm (scale 1 + w), then the final logit soft-cap",
            "Final logits are soft-capped (cap * tanh(x / cap)): the lens applies the cap "
            "after the unembedding (TransformerLens's output transform); attention logits "
            "are soft-capped too; post-norms as in Gemma 3.",
            _gemma2,
        ),
        Family(
            "gemma",
            "GemmaForCausalLM",
            "google/gemma-2b, gemma-7b",
            "metaspace",
            False,
            True,
            "RMSNorm (scale 1 + w)",
            "Embeddings scaled by sqrt(d_model); multi-query attention.",
            _gemma,
        ),
        Family(
            "llama",
            "LlamaForCausalLM",
            "meta-llama/Llama-3.2-1B, Llama-2-7b, Tower, SeaLLM",
            "metaspace",
            False,
            True,
            "RMSNorm",
            "Untied unembedding; the tiny model's tokenizer prepends <s> itself (Llama 2 "
            "style), mechlingo's batches come out the same as TransformerLens's to_tokens.",
            _llama,
        ),
        Family(
            "mistral",
            "MistralForCausalLM",
            "mistralai/Mistral-7B-v0.1",
            "metaspace",
            False,
            True,
            "RMSNorm",
            "As Llama (grouped-query attention, untied unembedding).",
            _mistral,
        ),
        Family(
            "qwen2",
            "Qwen2ForCausalLM",
            "Qwen/Qwen2.5-0.5B .. 72B",
            "qwen",
            False,
            True,
            "RMSNorm",
            "No BOS token and no BOS prepended (default_prepend_bos False): position 0 is a "
            "real token and is pooled/steered like any other; QKV biases; tied unembedding.",
            _qwen2,
        ),
        Family(
            "qwen3",
            "Qwen3ForCausalLM",
            "Qwen/Qwen3-0.6B .. 32B",
            "qwen",
            False,
            True,
            "RMSNorm",
            "As Qwen 2, plus RMSNorm on queries and keys.",
            _qwen3,
        ),
        Family(
            "bloom",
            "BloomForCausalLM",
            "bigscience/bloom-560m .. bloom-7b1, bloomz",
            "bytelevel",
            False,
            False,
            "LayerNorm",
            "ALiBi attention biases, no rotary or learned positions; a LayerNorm on the "
            "embeddings (before blocks.0.hook_resid_pre); no BOS prepended (default_prepend_bos "
            "False); GELU MLP, mlp_post is the GELU output.",
            _bloom,
        ),
        Family(
            "cohere",
            "CohereForCausalLM",
            "CohereForAI/aya-23-8B, aya-expanse-8b, c4ai-command-r",
            "bytelevel",
            True,
            True,
            "LayerNorm without bias",
            "Parallel attention + MLP from one LayerNorm: there is no resid_mid site, "
            "resid_post = resid_pre + attn_out + mlp_out; the logit_scale is folded into W_U "
            "by TransformerLens, so the lens reproduces the scaled logits.",
            _cohere,
        ),
        Family(
            "cohere2",
            "Cohere2ForCausalLM",
            "CohereForAI/c4ai-command-r7b-12-2024, aya-vision's text model",
            "bytelevel",
            True,
            True,
            "LayerNorm without bias",
            "As Cohere (parallel block, logit_scale folded into W_U), plus sliding-window "
            "layers interleaved with global layers that have no positional encoding.",
            _cohere2,
        ),
        Family(
            "gpt2",
            "GPT2LMHeadModel",
            "gpt2, mGPT (ai-forever/mGPT)",
            "gpt2",
            False,
            False,
            "LayerNorm",
            "Learned absolute positions; <|endoftext|> is BOS, EOS and padding at once "
            "(padding is told apart by the lengths, never by the id).",
            _gpt2,
        ),
        Family(
            "gpt_neox",
            "GPTNeoXForCausalLM",
            "EleutherAI/pythia-*, polyglot-ko",
            "nospace",
            True,
            False,
            "LayerNorm",
            "Parallel attention + MLP with two LayerNorms (no resid_mid); rotary on a part "
            "of each head; no BOS prepended. The tiny model's tokenizer has no leading-space "
            "marker (answers with and without a space are the same token).",
            _neox,
        ),
        Family(
            "xglm",
            "XGLMForCausalLM",
            "facebook/xglm-564M .. xglm-7.5B",
            "xglm",
            False,
            False,
            "LayerNorm",
            "Sinusoidal positions, embeddings scaled by sqrt(d_model); the tokenizer "
            "prepends </s> as its BOS.",
            _xglm,
        ),
        Family(
            "phi3",
            "Phi3ForCausalLM",
            "microsoft/Phi-3-mini-4k-instruct, Phi-3.5-mini",
            "metaspace",
            False,
            True,
            "RMSNorm",
            "Gate and up projections fused in one matrix (gate_up_proj); TransformerLens "
            "splits it, mlp_post is still the input of the down projection.",
            _phi3,
        ),
        Family(
            "olmo2",
            "Olmo2ForCausalLM",
            "allenai/OLMo-2-0425-1B",
            "bytelevel",
            False,
            True,
            "RMSNorm",
            "Norms after attention and MLP only (no pre-norms): attn_out/mlp_out are the "
            "normed outputs added to the residual.",
            _olmo2,
        ),
        Family(
            "stablelm",
            "StableLmForCausalLM",
            "stabilityai/stablelm-2-1_6b (7 European languages)",
            "gpt2",
            False,
            True,
            "LayerNorm",
            "LayerNorms with a gated SiLU MLP; rotary on a part of each head.",
            _stablelm,
        ),
        Family(
            "falcon",
            "FalconForCausalLM",
            "tiiuae/falcon-7b, falcon-rw-1b",
            "spacetoken",
            True,
            False,
            "LayerNorm",
            "Parallel attention + MLP from one LayerNorm (no resid_mid); multi-query "
            "attention; GELU MLP. The tiny model's tokenizer writes the space as a token of "
            "its own: answers are tracked by the word's first token, never the space.",
            _falcon,
        ),
    ]
}

# Architectures TransformerLens 4.3 loads but mechlingo refuses, with the reason.
_ENC_DEC = (
    "is an encoder-decoder: mechlingo's lens, patching and neuron sites assume one "
    "decoder stack reading the prompt (blocks.{l}.hook_resid_*), so its numbers would mix "
    "encoder and decoder layers"
)
_ENCODER = "is an encoder (masked LM or classifier), not a causal LM: there is no next token"
_SSM = (
    "has no attention blocks (state-space/recurrent layers): the attention sites, the "
    "head patching and the logit lens's layer convention do not apply"
)
_HYBRID = (
    "mixes attention and state-space layers: the per-layer sites are not the same hook in "
    "every block, so layer sweeps would silently skip or misread layers"
)
REFUSED: dict[str, str] = {
    **{
        a: _ENC_DEC
        for a in (
            "T5ForConditionalGeneration",
            "MT5ForConditionalGeneration",
            "T5WithLMHeadModel",
            "MBartForConditionalGeneration",
            "M2M100ForConditionalGeneration",
            "MarianMTModel",
            "BartForConditionalGeneration",
            "LongT5ForConditionalGeneration",
            "PegasusForConditionalGeneration",
            "BlenderbotForConditionalGeneration",
            "LEDForConditionalGeneration",
            "SwitchTransformersForConditionalGeneration",
            "T5GemmaForConditionalGeneration",
            "T5Gemma2ForConditionalGeneration",
            "Florence2ForConditionalGeneration",
        )
    },
    **{
        a: _ENCODER
        for a in (
            "BertForMaskedLM",
            "BertLMHeadModel",
            "RobertaForMaskedLM",
            "XLMRobertaForMaskedLM",
            "HubertForCTC",
            "HubertModel",
            "Wav2Vec2ForCTC",
            "Wav2Vec2ForPreTraining",
            "Wav2Vec2Model",
            "ViTModel",
            "ViTForImageClassification",
            "DeiTModel",
            "DeiTForImageClassification",
            "ASTForAudioClassification",
        )
    },
    **{
        a: _SSM
        for a in (
            "MambaForCausalLM",
            "Mamba2ForCausalLM",
            "FalconMambaForCausalLM",
            "RwkvForCausalLM",
            "RWKV7ForCausalLM",
            "HyenaDNAForCausalLM",
        )
    },
    **{
        a: _HYBRID
        for a in (
            "JambaForCausalLM",
            "BambaForCausalLM",
            "Zamba2ForCausalLM",
            "FalconH1ForCausalLM",
            "NemotronHForCausalLM",
            "GraniteMoeHybridForCausalLM",
            "RecurrentGemmaForCausalLM",
            "Lfm2ForCausalLM",
            "Lfm2MoeForCausalLM",
            "Qwen3NextForCausalLM",
            "OlmoHybridForCausalLM",
        )
    },
}

SUPPORTED_ARCHITECTURES: dict[str, str] = {f.architecture: f.name for f in FAMILIES.values()}


def family_of(architecture: str) -> Family | None:
    """The :class:`Family` of a transformers architecture class name, or ``None``."""
    name = SUPPORTED_ARCHITECTURES.get(architecture)
    return FAMILIES[name] if name else None


# --------------------------------------------------------------------------------------
# Tiny random models
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


def build_family_folder(family: str, folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny random model of ``family`` (a key of :data:`FAMILIES`) to ``folder``.

    Two layers, ``d_model`` 32, four heads, a vocabulary of a few hundred tokens from
    :func:`build_tokenizer`; weights drawn with ``seed``. Built offline from a transformers
    config and saved with ``save_pretrained``, so it loads through exactly the path a
    downloaded checkpoint of that family takes. Its outputs mean nothing.
    """
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise InputError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec.tokenizer)
    ids = _special_ids(tok)
    config = spec.config(len(tok), ids)
    config.architectures = [spec.architecture]
    torch.manual_seed(seed)
    hf_model = AutoModelForCausalLM.from_config(config)
    _randomize(hf_model, seed)
    hf_model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# Architectures whose forward pass cannot take a batch that grows between blocks: XGLM's
# attention checks that its mask has exactly the batch size the pass started with.
_NO_GROW = frozenset({"XGLMForCausalLM"})


def grows_mid_pass(model: Model) -> bool:
    """Whether a batch may grow between blocks of one forward pass (``patch_activations``'s
    ``batching="grow"``; ``"stack"`` gives the same numbers, it only costs more). Not with
    ALiBi (BLOOM, Falcon-RW, MPT): the bridge builds the bias once per pass as a
    ``[batch * heads, 1, key]`` tensor for the batch the pass started with, which does not
    broadcast over added rows; not with XGLM, whose attention requires a mask of exactly the
    starting batch size."""
    if str(getattr(model.cfg, "positional_embedding_type", "")) == "alibi":
        return False
    return str(getattr(model.cfg, "architecture", "")) not in _NO_GROW
