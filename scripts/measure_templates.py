"""Measure the zero-shot accuracy of every candidate template on the embedded model.

For each relation, ``--n`` facts are sampled (seed 0; the same facts for every language and
template), each candidate template of ``scripts/generate_data.py`` is filled in, and the
model completes the prompts greedily. A prompt counts as correct under the toolkit's eval rule
(:func:`mechlingo.core.answers.is_correct`: the first line of the continuation, normalized,
starts with the answer or an alias, at a word boundary outside zh/ja/ko). Results are written to a JSON file as they come
(reruns skip what is there unless ``--force``); at the end a ``MEASURED = {...}`` literal to
paste into the generator is printed.

    python scripts/measure_templates.py --model /tmp/scratch/hf --out /tmp/scratch/scores.json
    python scripts/measure_templates.py --translation   # translation-prompt label styles

The model is any transformers causal-LM folder (the default is the saved, dequantized
google/gemma-3-270m). CPU is fine: 40 prompts x 8 new tokens take a few seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pprint
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mechlingo.core.answers import is_correct as eval_is_correct  # noqa: E402
from mechlingo.core.answers import normalize  # noqa: E402
from mechlingo.data.facts import LANGS, RELATIONS, Fact  # noqa: E402
from mechlingo.data.prompts import translation_prompt  # noqa: E402


def is_correct(continuation: str, fact: Fact) -> bool:
    """The toolkit's eval rule (:func:`mechlingo.core.answers.is_correct`) for one fact."""
    return eval_is_correct(continuation, fact.answers, fact.lang)


def load_generator() -> Any:
    """Import scripts/generate_data.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "generate_data", ROOT / "scripts/generate_data.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_data"] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


class Completer:
    """Greedy batched completion with a transformers causal LM (left padding)."""

    def __init__(self, model_dir: str, max_new_tokens: int, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.max_new_tokens = max_new_tokens

    def __call__(
        self, prompts: list[str], facts: list[Fact] | None = None, batch_size: int = 48
    ) -> list[str]:
        """Greedy continuations of ``prompts``. With ``facts``, a row stops as soon as its
        verdict under :func:`is_correct` is settled (it starts with an answer, or can no
        longer become one), which gives the same verdicts as generating every token."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        tokenizer = self.tokenizer
        torch = self.torch

        class Settled(StoppingCriteria):
            def __init__(self, keys: list[list[str]], prompt_len: int) -> None:
                self.keys = keys
                self.prompt_len = prompt_len

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                texts = tokenizer.batch_decode(
                    input_ids[:, self.prompt_len :], skip_special_tokens=True
                )
                done = [_settled(t, k) for t, k in zip(texts, self.keys, strict=True)]
                return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

        outputs: list[str] = []
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            enc = tokenizer(batch, return_tensors="pt", padding=True)
            criteria = None
            if facts is not None:
                keys = [
                    [normalize(a) for a in f.answers] for f in facts[start : start + batch_size]
                ]
                criteria = StoppingCriteriaList([Settled(keys, enc["input_ids"].shape[1])])
            with torch.no_grad():
                out = self.model.generate(
                    **enc,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    stopping_criteria=criteria,
                )
            new = out[:, enc["input_ids"].shape[1] :]
            outputs += tokenizer.batch_decode(new, skip_special_tokens=True)
        return outputs


def _settled(raw: str, keys: list[str]) -> bool:
    """Whether more tokens can no longer change the eval-rule verdict: the first line is
    complete, or the normalized text can no longer grow into an answer (an answer that is
    already matched is followed by a character, so its word-boundary check is settled)."""
    if "\n" in raw:
        return True
    text = normalize(raw)
    return not any(key.startswith(text) for key in keys if key)


def sample_rows(gen: Any, n: int, seed: int = 0) -> dict[str, list[Any]]:
    """``n`` rows per relation, the same for every language and template."""
    rows = gen.collect_rows()
    rng = random.Random(seed)
    return {
        rel: sorted(rng.sample(r, min(n, len(r))), key=lambda x: x.key) for rel, r in rows.items()
    }


def score(completer: Completer, facts: list[Fact]) -> tuple[float, list[str]]:
    outputs = completer([f.prompt for f in facts], facts)
    correct = [is_correct(o, f) for o, f in zip(outputs, facts, strict=True)]
    return sum(correct) / len(facts), outputs


def measure_templates(args: argparse.Namespace, completer: Completer) -> None:
    gen = load_generator()
    rows = sample_rows(gen, args.n)
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    relations = args.relations or list(RELATIONS)
    langs = args.langs or list(LANGS)
    for relation in relations:
        for lang in langs:
            for template in gen.CANDIDATES[relation][lang]:
                key = f"{relation}|{lang}|{template}"
                if key in results and not args.force:
                    continue
                facts = gen.build_facts(
                    {relation: rows[relation]}, {(relation, lang): template}, langs=[lang]
                )
                t0 = time.time()
                acc, outputs = score(completer, facts)
                results[key] = {
                    "accuracy": acc,
                    "n": len(facts),
                    "examples": [
                        [f.prompt, f.answer, o] for f, o in zip(facts, outputs, strict=True)
                    ],
                }
                out.write_text(json.dumps(results, ensure_ascii=False, indent=1))
                print(f"{relation:13s} {lang} {acc:5.2f} {time.time() - t0:5.1f}s {template!r}")
                print("   ", [o for o in outputs[:3]], flush=True)
    measured: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in results.items():
        if key.startswith("translation|"):
            continue
        relation, lang, template = key.split("|", 2)
        measured.setdefault(relation, {}).setdefault(lang, {})[template] = round(
            value["accuracy"], 3
        )
    print("MEASURED = " + pprint.pformat(measured, width=100, sort_dicts=True))


def measure_translation(args: argparse.Namespace, completer: Completer) -> None:
    """Accuracy of translation prompts (English source) with English or native labels."""
    from mechlingo.data.io import load_facts

    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    relations = args.relations or ["capital", "continent"]
    for lang in args.langs or list(LANGS):
        pool = load_facts(langs=[lang])
        facts = [f for f in pool if f.relation in relations]
        facts = random.Random(0).sample(facts, min(args.n, len(facts)))
        for labels in ("en", "native"):
            for k in (0, 3):
                key = f"translation|{lang}|{labels}|k={k}"
                if key in results and not args.force:
                    continue
                prompts = [translation_prompt(f, k=k, pool=pool, labels=labels) for f in facts]
                outputs = completer(prompts, facts)
                acc = sum(is_correct(o, f) for o, f in zip(outputs, facts, strict=True)) / len(
                    facts
                )
                results[key] = {"accuracy": acc, "n": len(facts), "example": prompts[0]}
                out.write_text(json.dumps(results, ensure_ascii=False, indent=1))
                print(
                    f"translation {lang} labels={labels} k={k}: {acc:.2f}", outputs[:2], flush=True
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/tmp/scratch/hf")
    parser.add_argument("--out", default="/tmp/scratch/template_scores.json")
    parser.add_argument("--n", type=int, default=40, help="facts per template")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--relations", nargs="*")
    parser.add_argument("--langs", nargs="*")
    parser.add_argument("--force", action="store_true", help="remeasure what is in --out")
    parser.add_argument("--translation", action="store_true", help="measure translation prompts")
    args = parser.parse_args(argv)
    completer = Completer(args.model, args.max_new_tokens, args.threads)
    if args.translation:
        measure_translation(args, completer)
    else:
        measure_templates(args, completer)


if __name__ == "__main__":
    main()
