"""The experiment behind docs/methods/logit-lens.md ("Is the English pivot an artifact of
the lens?"): the same capital-city facts read by the logit lens, tuned lenses and the
patchscope on the embedded model, and the held-out KL of each lens per layer.

    python scripts/decoder_pivot.py facts --decoders logit,patchscope --out DIR
    python scripts/decoder_pivot.py facts --decoders tuned-en=DIR_EN,tuned-mix=DIR_MIX --out DIR
    python scripts/decoder_pivot.py divergence --lenses tuned-en=DIR_EN,tuned-mix=DIR_MIX \
        --text NTREX_DIR --lines 900:1005 --out DIR
    python scripts/decoder_pivot.py table --out DIR          # pivot table + figure

Train the lenses first with ``mechlingo tuned-lens`` (see the docs page for the commands).
Facts: the bundled ``capital`` relation (tuned templates), the first ``--limit`` facts per
language whose answer differs from the English one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mechlingo import load_model
from mechlingo.analyses.decoders.compare import DecoderComparison, compare_decoders
from mechlingo.analyses.decoders.patchscope import Patchscope
from mechlingo.analyses.decoders.tuned_lens import lens_divergence, load_tuned_lens, mix_texts
from mechlingo.data import load_facts
from mechlingo.data.io import read_parallel_dir


def _facts(langs: list[str], limit: int) -> list:
    out = []
    for lg in langs:
        fs = [
            f
            for f in load_facts(langs=[lg], relations=["capital"])
            if f.answer.strip().casefold() != (f.answer_en or "").strip().casefold()
        ]
        out += fs[:limit]
    return out


def _decoders(spec: str, model) -> dict:
    out = {}
    for item in spec.split(","):
        label, _, path = item.partition("=")
        if label == "patchscope-en":  # the control: one English identity prompt for all
            out[label] = Patchscope(target="en")
        else:
            out[label] = load_tuned_lens(path, model) if path else label
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["facts", "divergence", "table"])
    p.add_argument("--out", required=True)
    p.add_argument("--decoders", default="logit,patchscope")
    p.add_argument("--lenses", default="")
    p.add_argument("--langs", default="fr,de,ru,zh,ja")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--text", default="/work/shared/data/ntrex/dev")
    p.add_argument("--lines", default="900:1005")
    p.add_argument("--per-lang", type=int, default=2)
    p.add_argument("--positions", type=int, default=4)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    if a.what == "table":
        results = {}
        for f in sorted(out.glob("facts-*.pt")):
            results |= torch.load(f, weights_only=False)
        names = ("logit", "tuned-en", "tuned-mix", "patchscope", "patchscope-en")
        order = [k for k in names if k in results]
        cmp = DecoderComparison({k: results[k] for k in order})
        table = cmp.pivot_table()
        (out / "pivot.json").write_text(json.dumps(table, indent=1, default=str))
        cmp.fig_curves().write_html(out / "curves.html")
        for r in table:
            print(json.dumps(r, default=str))
        return
    model = load_model(device="cpu")
    t0 = time.time()
    if a.what == "facts":
        facts = _facts(a.langs.split(","), a.limit)
        cmp = compare_decoders(model, facts, _decoders(a.decoders, model), batch_size=8)
        tag = "-".join(cmp.results)
        torch.save(cmp.results, out / f"facts-{tag}.pt")
        print(f"{len(facts)} facts, {tag}: {time.time() - t0:.0f}s")
    else:
        lo, hi = (int(x) for x in a.lines.split(":"))
        by = read_parallel_dir(a.text)
        texts = mix_texts({k: v[lo:hi] for k, v in by.items()}, a.per_lang)
        lenses = {"logit": None} | _decoders(a.lenses, model)
        div = lens_divergence(model, texts, lenses, positions_per_text=a.positions)
        div["seconds"] = round(time.time() - t0, 1)
        (out / "divergence.json").write_text(json.dumps(div, indent=1))
        print(json.dumps(div)[:2000])


if __name__ == "__main__":
    main()
