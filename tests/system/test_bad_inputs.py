"""Bad input never gives a traceback, a silently wrong number or a half-written artifact.

A table of bad command lines (run in-process through :func:`mechlingo.cli.main` on the tiny
test model) and bad library calls. Every CLI case asserts the exit status, a fragment of the
one-line message, no traceback, and that the working folder (``--out`` included) and the model
cache are byte-for-byte untouched. Kill tests SIGKILL a forked child in the middle of an artifact
write and check that the old folder is intact and the leftovers are cleaned up at the next
start. The reproductions of reported bugs are marked ``reported-`` in their ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from mechlingo.cli import main
from tests.forks import fork_call

CPU_ONLY = (pytest.mark.skipif(torch.cuda.is_available(), reason="needs CPU-only torch"),)


# --------------------------------------------------------------------------------------
# Fixtures: data files, artifacts and broken copies of them
# --------------------------------------------------------------------------------------


def _facts_dicts(langs: list[str], limit: int, relation: str = "capital") -> list[dict]:
    from mechlingo.data import load_facts

    return [f.to_json() for f in load_facts(langs=langs, relations=[relation], limit=limit)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, fn: Any) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def P(tiny_dir, tmp_path_factory) -> dict[str, str]:
    """Paths of every fixture file, by name (used as ``{name}`` in the case table)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    p: dict[str, Path] = {"T": Path(tiny_dir)}
    # --- facts files
    d = root / "facts"
    d.mkdir()
    capital = _facts_dicts(["en", "fr"], 4)
    klar = [dict(r, relation="klar") for r in capital]
    p["klar"] = _write_jsonl(d / "klar.jsonl", klar)
    p["empty_jsonl"] = d / "empty.jsonl"
    p["empty_jsonl"].write_text("")
    p["blank_jsonl"] = d / "blank.jsonl"
    p["blank_jsonl"].write_text("\n\n  \n")
    from mechlingo.data import FIELDS, write_tsv
    from mechlingo.data.facts import fact_from_mapping

    p["header_tsv"] = d / "header.tsv"
    p["header_tsv"].write_text("\t".join(FIELDS) + "\n")
    p["good_tsv"] = d / "good.tsv"
    write_tsv([fact_from_mapping(r, "x", 1) for r in capital], p["good_tsv"])
    lat = _write_jsonl(d / "latin1.jsonl", capital[:2])
    lat.write_bytes(
        lat.read_bytes() + json.dumps(capital[2]).encode().replace(b"}", b', "x": "\xe9"}') + b"\n"
    )
    p["latin1_jsonl"] = lat
    tsv = p["good_tsv"].read_bytes().split(b"\n")
    tsv[2] = tsv[2].replace(b"\t", b"\t\xe9", 1)
    p["latin1_tsv"] = d / "latin1.tsv"
    p["latin1_tsv"].write_bytes(b"\n".join(tsv))
    p["dir_jsonl"] = d / "x.jsonl"
    p["dir_jsonl"].mkdir()
    p["csv"] = d / "facts.csv"
    p["csv"].write_text("id,lang\n")
    p["badjson"] = d / "badjson.jsonl"
    p["badjson"].write_text(json.dumps(capital[0]) + "\n{bad json\n")
    p["nofield"] = _write_jsonl(
        d / "nofield.jsonl", [{k: v for k, v in capital[0].items() if k != "answer"}]
    )
    p["badlang"] = _write_jsonl(d / "badlang.jsonl", [dict(capital[0], lang="xx")])
    p["dup"] = _write_jsonl(d / "dup.jsonl", [capital[0], capital[0]])
    p["trailing"] = _write_jsonl(
        d / "trailing.jsonl", [dict(capital[0], prompt=capital[0]["prompt"] + " ")]
    )
    p["notobj"] = d / "notobj.jsonl"
    p["notobj"].write_text("[1, 2]\n")
    long_rows = [dict(r) for r in capital]
    subj = long_rows[2]["subject"]
    long_rows[2]["prompt"] = "word " * 200 + long_rows[2]["prompt"]
    long_rows[2]["subject_span"] = None
    long_rows[2].pop("subject_span")
    assert subj in long_rows[2]["prompt"]
    p["long"] = _write_jsonl(d / "long.jsonl", long_rows)
    huge_rows = [dict(r) for r in capital]
    huge_rows[0]["prompt"] = "lorem ipsum " * 13000 + huge_rows[0]["prompt"]
    huge_rows[0].pop("subject_span")
    p["huge"] = _write_jsonl(d / "huge.jsonl", huge_rows)
    p["missing"] = d / "missing.jsonl"
    # --- parallel text folders
    from mechlingo.data import parallel_sentences

    texts = parallel_sentences(["en", "es", "fr"], limit=12)

    def text_dir(name: str, edit: Any = None) -> Path:
        folder = root / name
        folder.mkdir()
        for lg, lines in texts.items():
            data = ("\n".join(lines) + "\n").encode()
            (folder / f"{lg}.txt").write_bytes(edit(lg, data) if edit else data)
        return folder

    p["par"] = text_dir("par")
    p["par_latin1"] = text_dir(
        "par_latin1",
        lambda lg, b: (
            b.replace(b"\n", b"\n\xe9", 3).replace(b"\n\xe9", b"\n", 2) if lg == "es" else b
        ),
    )
    p["par_misaligned"] = text_dir(
        "par_misaligned", lambda lg, b: b + b"extra\n" if lg == "fr" else b
    )
    p["par_long"] = text_dir(
        "par_long", lambda lg, b: b.replace(b"\n", b" " + b"word " * 700 + b"\n", 1)
    )
    p["par_empty"] = root / "par_empty"
    p["par_empty"].mkdir()
    p["par_file"] = root / "par.txt"
    p["par_file"].write_text("hello\n")
    # --- model folders and files
    m = root / "models"
    m.mkdir()
    p["M_cfg"] = m / "cfg_only"
    p["M_cfg"].mkdir()
    shutil.copy(p["T"] / "config.json", p["M_cfg"])
    p["M_noweights"] = _copy(p["T"], m / "noweights")
    for f in p["M_noweights"].glob("*.safetensors"):
        f.unlink()
    p["M_notok"] = _copy(p["T"], m / "notok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (p["M_notok"] / name).unlink(missing_ok=True)
    p["M_trunc"] = _copy(p["T"], m / "trunc")
    w = p["M_trunc"] / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    p["M_zero"] = _copy(p["T"], m / "zero")
    w = p["M_zero"] / "model.safetensors"
    w.write_bytes(bytes(w.stat().st_size))
    p["M_badcfg"] = _copy(p["T"], m / "badcfg")
    (p["M_badcfg"] / "config.json").write_text("{not json")
    p["G_empty"] = m / "empty.gguf"
    p["G_empty"].write_bytes(b"")
    p["G_trunc"] = m / "trunc.gguf"
    p["G_trunc"].write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    p["G_notgguf"] = m / "not.gguf"
    p["G_notgguf"].write_bytes(b"hello world" * 10)
    p["G_missing"] = m / "missing.gguf"
    p["M_txt"] = m / "model.txt"
    p["M_txt"].write_text("not a model")
    # --- artifacts: vectors (steer build) and clamps (experts) on the tiny model
    a = root / "artifacts"
    a.mkdir()
    T = str(p["T"])
    p["V"] = a / "vectors"
    assert main(["steer", "build", "--model", T, "--langs", "en,fr", "--limit", "16",
                 "--out", str(p["V"]), "--quiet", "--split", "0.6,0.2,0.2"]) == 0  # fmt: skip
    p["E"] = a / "experts"
    assert main(["experts", "--model", T, "--langs", "en,es,fr", "--target", "es", "--lines",
                 "8", "--k", "5", "--no-curve", "--out", str(p["E"]), "--quiet"]) == 0  # fmt: skip
    p["C"] = p["E"] / "es-k5"
    from mechlingo.testing import build_tiny_folder

    p["T_B"] = build_tiny_folder(root / "tiny_b", seed=1)
    p["V_B"] = a / "vectors_b"
    assert main(["steer", "build", "--model", str(p["T_B"]), "--langs", "en,fr", "--limit",
                 "16", "--out", str(p["V_B"]), "--quiet", "--split", "0.6,0.2,0.2"]) == 0  # fmt: skip
    p["C_B"] = a / "clamp_b"
    assert main(["experts", "--model", str(p["T_B"]), "--langs", "en,es,fr", "--target", "es",
                 "--lines", "8", "--k", "5", "--no-curve", "--out", str(a / "eb"), "--quiet"]) == 0  # fmt: skip
    shutil.copytree(a / "eb" / "es-k5", p["C_B"])

    def clamp(name: str, fn: Any) -> None:
        p[name] = _copy(p["C"], a / name)
        fn(p[name])

    st, js = "intervention.safetensors", "intervention.json"
    clamp("C_trunc", lambda f: (f / st).write_bytes((f / st).read_bytes()[:-40]))
    clamp("C_zero", lambda f: (f / st).write_bytes(bytes((f / st).stat().st_size)))
    clamp("C_empty_st", lambda f: (f / st).write_bytes(b""))
    clamp("C_nomode", lambda f: _edit_json(f / js, lambda d: d["config"].pop("mode")))
    clamp("C_nokind", lambda f: _edit_json(f / js, lambda d: d.pop("kind")))
    clamp("C_badkind", lambda f: _edit_json(f / js, lambda d: d.update(kind="Magic")))
    clamp("C_badjson", lambda f: (f / js).write_text("{not json"))
    clamp("C_list", lambda f: (f / js).write_text("[]"))
    clamp("C_format", lambda f: _edit_json(f / js, lambda d: d.update(format=99)))
    clamp("C_nomodel", lambda f: _edit_json(f / js, lambda d: d["meta"].pop("model")))
    clamp("C_nojson", lambda f: (f / js).unlink())
    clamp(
        "C_latin1",
        lambda f: (f / js).write_bytes((f / js).read_bytes().replace(b'"set"', b'"s\xe9t"')),
    )
    p["C_missing"] = a / "no_such_clamp"
    p["C_file"] = a / "clamp.txt"
    p["C_file"].write_text("x")

    def vectors(name: str, fn: Any) -> None:
        p[name] = _copy(p["V"], a / name)
        fn(p[name])

    vectors(
        "V_trunc", lambda f: (f / "task" / st).write_bytes((f / "task" / st).read_bytes()[:100])
    )
    vectors(
        "V_zero", lambda f: (f / "diff" / st).write_bytes(bytes((f / "diff" / st).stat().st_size))
    )
    vectors("V_nodiff", lambda f: shutil.rmtree(f / "diff"))
    vectors("V_badbuild", lambda f: (f / "build.json").write_text("{"))
    vectors("V_badjson", lambda f: (f / "task" / js).write_text("nope"))
    vectors("V_nomodel", lambda f: _edit_json(f / "task" / js, lambda d: d["meta"].pop("model")))
    p["V_missing"] = a / "no_such_vectors"
    # --- output paths
    p["a_file"] = root / "a_file"
    p["a_file"].write_text("x")
    p["foreign"] = root / "foreign"
    p["foreign"].mkdir()
    (p["foreign"] / "notes.txt").write_text("mine")
    return {k: str(v) for k, v in p.items()}


@pytest.fixture()
def sandbox(tmp_path, monkeypatch):
    """A fresh working folder (with an old ``out`` folder) and model cache for one case."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "summary.json").write_text('{"old": true}')
    (work / "out" / "report.html").write_text("old report")
    cache = tmp_path / "cache"
    (cache / "gemma-3-270m").mkdir(parents=True)
    (cache / "gemma-3-270m" / "sentinel").write_text("cached")
    monkeypatch.setenv("MECHLINGO_CACHE", str(cache))
    monkeypatch.chdir(work)
    return work, cache


def snapshot(*roots: Path) -> dict[str, Any]:
    """Every path under ``roots`` with its type, size and content hash."""
    out: dict[str, Any] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            key = str(path)
            if path.is_dir():
                out[key] = "dir"
            else:
                out[key] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def run_cli(argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


# --------------------------------------------------------------------------------------
# The CLI table
# --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One bad command line: ``argv`` (``{name}`` = a fixture path), expected exit status
    and a message fragment (lower case)."""

    id: str
    argv: str
    code: int
    fragment: str
    ok_outputs: tuple[str, ...] = ()
    setup: Any = None
    marks: tuple = field(default_factory=tuple)


BASE = {
    "lens": "lens --model {T} --langs en,fr --limit 2 --quiet",
    "eval": "eval --model {T} --langs en,fr --limit 2 --quiet --max-new-tokens 2",
    "trace": "trace --model {T} --langs en,fr --limit 2 --quiet --patch-prompts 0 --max-new-tokens 2",
    "build": "steer build --model {T} --langs en,fr --limit 16 --quiet --split 0.6,0.2,0.2",
    "steer-eval": "steer eval --model {T} --vectors {V} --langs en,fr --limit 16 --quiet "
    "--split 0.6,0.2,0.2 --config 0,0.1,1,0.1 --max-new-tokens 2",
    "experts": "experts --model {T} --langs en,es,fr --target es --lines 8 --k 5 --no-curve --quiet",
    "align": "align --model {T} --langs en,es,fr --lines 8 --quiet --clamp {C}",
}


def _ro(monkeypatch: Any, work: Path) -> None:
    (work / "ro").mkdir()
    import mechlingo.cli.places as v

    real = v._writable
    monkeypatch.setattr(v, "_writable", lambda f: False if f.name == "ro" else real(f))


CASES: list[Case] = [
    # ---- reported: silently wrong results
    Case(
        "reported-eval-batch-size-neg",
        "{eval} --batch-size -2",
        2,
        "--batch-size must be at least 1",
    ),
    Case(
        "reported-eval-max-new-tokens-neg",
        "{eval} --max-new-tokens -1",
        2,
        "--max-new-tokens must be at least 1",
    ),
    Case("reported-langs-comma", "{eval} --langs ,", 2, "--langs ',' has an empty language"),
    Case(
        "reported-relation-comma", "{eval} --relation ,", 2, "--relation ',' has an empty relation"
    ),
    Case("reported-experts-lang-comma", "{experts} --target ,", 2, "--target ',' has an empty"),
    Case("reported-dtype-nn", "{eval} --dtype nn", 2, "'nn' is not a floating-point torch dtype"),
    Case(
        "reported-align-target-xx",
        "{align} --target xx",
        2,
        "unknown language(s) ['xx'] in --target",
    ),
    Case(
        "reported-context-671",
        "{eval} --facts {long} --langs en,fr",
        2,
        "more than the model's context of 512",
    ),
    Case(
        "reported-context-39k",
        "{lens} --facts {huge} --langs en,fr",
        2,
        "more than the model's context",
    ),
    # ---- reported: tracebacks
    Case(
        "reported-data-dir-named-jsonl",
        "{eval} --facts {dir_jsonl}",
        2,
        "is a folder, not a facts file",
    ),
    Case("reported-device-cuda", "{eval} --device cuda", 2, "no cuda device", marks=CPU_ONLY),
    Case("reported-device-gpu0", "{eval} --device gpu0", 2, "'gpu0' is not a device"),
    Case("reported-model-config-only", "{eval} --model {M_cfg}", 2, "no weights"),
    Case("reported-gguf-truncated-header", "{eval} --model {G_trunc}", 2, "truncated header"),
    Case("reported-out-existing-file", "{eval} --out {a_file}", 2, "is an existing file"),
    Case(
        "reported-out-file-sub",
        "{eval} --out {a_file}/sub",
        2,
        "is a file, so no folder can be created",
    ),
    Case("reported-out-read-only", "{eval} --out ro/o", 2, "is not writable", setup=_ro),
    Case("reported-out-empty", "{eval} --out=", 2, "--out is empty"),
    Case("reported-vectors-truncated-st", "{steer-eval} --vectors {V_trunc}", 2, "safetensors"),
    Case("reported-clamp-truncated-st", "{align} --clamp {C_trunc}", 2, "truncated"),
    Case("reported-clamp-zeroed-st", "{align} --clamp {C_zero}", 2, "not a valid safetensors"),
    Case(
        "reported-vectors-zeroed-st",
        "{steer-eval} --vectors {V_zero}",
        2,
        "not a valid safetensors",
    ),
    Case("reported-clamp-no-config-mode", "{align} --clamp {C_nomode}", 2, "'mode'"),
    # ---- reported: unclear messages and defaults
    Case(
        "reported-data-default-relation",
        "{eval} --facts {klar}",
        0,
        "",
        ok_outputs=("summary.json", "report.html"),
    ),
    Case("reported-langs-repeated", "{eval} --langs en,en", 2, "'en' more than once"),
    Case(
        "reported-empty-jsonl", "{eval} --facts {empty_jsonl}", 2, "line 1: the file holds no facts"
    ),
    Case(
        "reported-header-only-tsv",
        "{eval} --facts {header_tsv}",
        2,
        "line 2: the file has a header line but no facts",
    ),
    Case(
        "reported-latin1-facts",
        "{eval} --facts {latin1_jsonl}",
        2,
        "latin1.jsonl, line 3: byte 0xe9",
    ),
    Case(
        "reported-latin1-experts-text",
        "{experts} --parallel {par_latin1}",
        2,
        "es.txt, line 4: byte 0xe9",
    ),
    Case(
        "reported-batch-size-zero",
        "{eval} --batch-size 0",
        2,
        "--batch-size must be at least 1, got 0",
    ),
    Case("reported-empty-gguf", "{eval} --model {G_empty}", 2, "is empty (0 bytes)"),
    Case(
        "reported-corrupt-intervention-json",
        "{align} --clamp {C_badjson}",
        2,
        "intervention.json is not valid json",
    ),
    Case(
        "reported-k-too-large",
        "{experts} --k 100000",
        2,
        "--k 100000 is more than the 256 mlp neurons",
    ),
    Case(
        "reported-align-layer-99",
        "{align} --layer 99",
        2,
        "--layer 99 is out of range for a model with 2 layers",
    ),
    Case(
        "reported-vectors-without-meta-model",
        "{steer-eval} --vectors {V_nomodel}",
        2,
        "records no model",
    ),
    Case("reported-clamp-without-meta-model", "{align} --clamp {C_nomodel}", 2, "records no model"),
    Case("reported-vectors-other-model", "{steer-eval} --vectors {V_B}", 2, "unembed_fingerprint"),
    Case("reported-clamp-other-model", "{align} --clamp {C_B}", 2, "unembed_fingerprint"),
    # ---- each command runs (the table's baselines are valid)
    *[Case(f"ok-{name}", f"{{{name}}}", 0, "", ok_outputs=("summary.json",)) for name in BASE],
    Case("ok-tsv", "{eval} --facts {good_tsv}", 0, "", ok_outputs=("generations.jsonl",)),
    Case(
        "ok-relation-all-data",
        "{eval} --facts {klar} --relation all",
        0,
        "",
        ok_outputs=("summary.json",),
    ),
    Case("ok-align-target", "{align} --target fr", 0, "", ok_outputs=("summary.json",)),
    Case("ok-out-new-nested", "{eval} --out new/deeper/o", 0, "", ok_outputs=()),
    Case("ok-experts-text-dir", "{experts} --parallel {par}", 0, "", ok_outputs=("es-k5",)),
    Case(
        "ok-experts-max-tokens",
        "{experts} --parallel {par_long} --max-tokens 16",
        0,
        "",
        ok_outputs=("es-k5",),
    ),
    # ---- languages and relations
    Case("langs-unknown", "{eval} --langs en,xx", 2, "unknown language(s) ['xx']"),
    Case("langs-trailing-comma", "{eval} --langs en,", 2, "empty language"),
    Case("langs-double-comma", "{lens} --langs en,,fr", 2, "empty language"),
    Case("langs-empty", "{lens} --langs=", 2, "--langs is empty"),
    Case("langs-space", "{lens} --langs ' '", 2, "--langs is empty"),
    Case("langs-upper", "{lens} --langs EN,en", 2, "names en more than once"),  # EN is en
    Case("langs-repeated-trace", "{trace} --langs fr,de,fr", 2, "'fr' more than once"),
    Case("langs-repeated-build", "{build} --langs en,fr,en", 2, "'en' more than once"),
    Case("langs-comma-experts", "{experts} --langs ,", 2, "empty language"),
    Case("langs-unknown-experts", "{experts} --langs en,es,xx", 2, "unknown language(s) ['xx']"),
    Case("langs-repeated-align", "{align} --langs en,en,fr", 2, "'en' more than once"),
    Case("langs-not-in-data", "{eval} --facts {klar} --langs de", 2, "no facts in"),
    Case("relation-unknown", "{eval} --relation weather", 2, "unknown relation(s) ['weather']"),
    Case("relation-repeated", "{eval} --relation capital,capital", 2, "'capital' more than once"),
    Case("relation-empty", "{eval} --relation=", 2, "--relation is empty"),
    Case(
        "relation-not-in-data",
        "{eval} --facts {klar} --relation capital",
        2,
        "valid relations are ['klar']",
    ),
    Case("relation-trailing-comma", "{lens} --relation capital,", 2, "empty relation"),
    Case("track-unknown", "{lens} --track xx", 2, "unknown language(s) ['xx'] in --track"),
    Case("track-comma", "{lens} --track ,", 2, "empty language"),
    Case(
        "seeds-not-ints",
        "{steer-eval} --control-seeds 0,x",
        2,
        "--control-seeds takes comma-separated integers",
    ),
    Case(
        "experts-lang-unknown", "{experts} --target xx", 2, "unknown language(s) ['xx'] in --target"
    ),
    Case(
        "experts-target-not-bundled",
        "{experts} --target sv",
        2,
        "unknown language(s) ['sv'] in --target",
    ),
    Case("experts-lang-repeated", "{experts} --target es,es", 2, "'es' more than once"),
    Case(
        "align-target-not-bundled",
        "{align} --target sv",
        2,
        "unknown language(s) ['sv'] in --target",
    ),
    Case("align-target-comma", "{align} --target ,", 2, "empty language"),
    # ---- sizes
    Case("limit-zero", "{eval} --limit 0", 2, "--limit must be at least 1"),
    Case("limit-neg", "{lens} --limit -1", 2, "--limit must be at least 1"),
    Case("limit-not-int", "{lens} --limit x", 2, ""),
    Case("batch-size-zero-lens", "{lens} --batch-size 0", 2, "--batch-size must be at least 1"),
    Case("batch-size-zero-trace", "{trace} --batch-size 0", 2, "--batch-size must be at least 1"),
    Case("batch-size-zero-build", "{build} --batch-size 0", 2, "--batch-size must be at least 1"),
    Case(
        "batch-size-neg-steer-eval",
        "{steer-eval} --batch-size -1",
        2,
        "--batch-size must be at least 1",
    ),
    Case(
        "batch-size-zero-experts", "{experts} --batch-size 0", 2, "--batch-size must be at least 1"
    ),
    Case("batch-size-zero-align", "{align} --batch-size 0", 2, "--batch-size must be at least 1"),
    Case(
        "max-new-tokens-zero", "{eval} --max-new-tokens 0", 2, "--max-new-tokens must be at least 1"
    ),
    Case(
        "max-new-tokens-zero-trace",
        "{trace} --max-new-tokens 0",
        2,
        "--max-new-tokens must be at least 1",
    ),
    Case(
        "max-new-tokens-neg-steer",
        "{steer-eval} --max-new-tokens -3",
        2,
        "--max-new-tokens must be at least 1",
    ),
    Case("max-rank-zero", "{lens} --max-rank 0", 2, "--max-rank must be at least 1"),
    Case("k-shot-zero", "{build} --k-shot 0", 2, "--k-shot must be at least 1"),
    Case("patch-prompts-neg", "{trace} --patch-prompts -1", 2, "--patch-prompts must be 0 or more"),
    Case(
        "cells-per-batch-zero",
        "{trace} --cells-per-batch 0",
        2,
        "--cells-per-batch must be at least 1",
    ),
    Case("top-k-zero", "{steer-eval} --top-k 0", 2, "--top-k must be at least 1"),
    Case(
        "dev-per-lang-zero", "{steer-eval} --dev-per-lang 0", 2, "--dev-per-lang must be at least 1"
    ),
    Case(
        "test-per-lang-neg",
        "{steer-eval} --test-per-lang -1",
        2,
        "--test-per-lang must be at least 1",
    ),
    Case("offset-neg", "{experts} --offset -1", 2, "--offset must be 0 or more"),
    Case("max-tokens-zero", "{experts} --max-tokens 0", 2, "--max-tokens must be at least 1"),
    Case("samples-zero", "{experts} --samples 0", 2, "--samples must be at least 1"),
    Case("new-tokens-zero", "{experts} --sample-tokens 0", 2, "--sample-tokens must be at least 1"),
    Case("heldout-zero", "{experts} --heldout 0", 2, "--heldout must be at least 1"),
    Case("ok-seed-neg", "{experts} --seed -1", 0, "", ok_outputs=("es-k5",)),
    Case("limit-zero-align", "{align} --lines 0", 2, "--lines must be at least 1"),
    Case("offset-past-end", "{align} --offset 100000", 2, "no sentences left"),
    Case("split-bad", "{build} --split 0.5,0.5", 2, "--split takes three fractions"),
    Case("split-negative", "{build} --split 1.2,-0.1,-0.1", 2, "--split takes three fractions"),
    # ---- k and layers
    Case("k-zero", "{experts} --k 0", 2, "--k needs positive integers"),
    Case("k-neg", "{experts} --k 5,-1", 2, "--k needs positive integers"),
    Case("k-comma", "{experts} --k ,", 2, "empty number"),
    Case("k-text", "{experts} --k many", 2, "--k takes comma-separated integers"),
    Case("k-too-large-layer", "{experts} --layers 0 --k 200", 2, "more than the 128 mlp neurons"),
    Case("experts-layer-99", "{experts} --layers 0,99", 2, "--layers 99 is out of range"),
    Case("experts-layer-neg-99", "{experts} --layers -3", 2, "--layers -3 is out of range"),
    Case(
        "experts-layer-text", "{experts} --layers one", 2, "--layers takes comma-separated integers"
    ),
    Case("experts-layer-comma", "{experts} --layers ,", 2, "empty number"),
    Case("align-layer-neg", "{align} --layer -3", 2, "--layer -3 is out of range"),
    Case(
        "task-layers-99",
        "steer eval --model {T} --vectors {V} --task-layers 0,99",
        2,
        "--task-layers 99 is out of range",
    ),
    Case(
        "diff-layers-text",
        "{steer-eval} --diff-layers a",
        2,
        "--diff-layers takes comma-separated integers",
    ),
    Case("task-alphas-nan", "{steer-eval} --task-alphas nan", 2, "--task-alphas has nan"),
    Case("diff-alphas-inf", "{steer-eval} --diff-alphas 0.1,inf", 2, "--diff-alphas has inf"),
    Case(
        "task-alphas-text",
        "{steer-eval} --task-alphas big",
        2,
        "--task-alphas takes comma-separated numbers",
    ),
    Case("config-three", "{steer-eval} --config 0,0.1,1", 2, "--config takes four numbers"),
    Case("config-layer-99", "{steer-eval} --config 99,0.1,1,0.1", 2, "--config 99 is out of range"),
    Case("config-float-layer", "{steer-eval} --config 0.5,0.1,1,0.1", 2, "layers must be integers"),
    Case("config-nan-alpha", "{steer-eval} --config 0,nan,1,0.1", 2, "--config has nan"),
    Case("mid-layers-text", "{trace} --mid-layers a-b", 2, "--mid-layers 'a-b'"),
    Case("patch-sites-unknown", "{trace} --patch-sites resid,bogus", 2, "unknown site"),
    Case("patch-sites-comma", "{trace} --patch-sites ,", 2, "empty site"),
    # ---- device and dtype
    Case("device-cuda1", "{eval} --device cuda:1", 2, "no cuda device", marks=CPU_ONLY),
    Case("device-empty", "{eval} --device=", 2, "--device is empty"),
    Case("device-tpu", "{lens} --device xla", 2, ""),
    Case("device-meta", "{lens} --device meta", 2, "mechlingo runs on cpu, cuda or mps"),
    Case("device-cuda-experts", "{experts} --device cuda", 2, "no cuda device", marks=CPU_ONLY),
    Case("device-gpu0-align", "{align} --device gpu0", 2, "not a device"),
    Case("device-cuda-build", "{build} --device cuda", 2, "no cuda device", marks=CPU_ONLY),
    Case("dtype-int8", "{eval} --dtype int8", 2, "'int8' is not a floating-point"),
    Case("dtype-empty", "{eval} --dtype=", 2, "is not a floating-point"),
    Case("dtype-typo", "{lens} --dtype flaot32", 2, "'flaot32' is not a floating-point"),
    Case("dtype-nn-experts", "{experts} --dtype nn", 2, "is not a floating-point"),
    Case("dtype-tensor", "{trace} --dtype Tensor", 2, "is not a floating-point"),
    # ---- models
    Case("model-no-weights", "{eval} --model {M_noweights}", 2, "no weights"),
    Case("model-no-tokenizer", "{eval} --model {M_notok}", 2, "no tokenizer files"),
    Case("model-truncated-weights", "{eval} --model {M_trunc}", 2, "is truncated"),
    Case("model-zeroed-weights", "{lens} --model {M_zero}", 2, "not a valid safetensors"),
    Case("model-bad-config", "{lens} --model {M_badcfg}", 2, "config.json is not valid json"),
    Case("model-not-gguf", "{eval} --model {G_notgguf}", 2, "no gguf magic"),
    Case("model-gguf-missing", "{eval} --model {G_missing}", 2, "does not exist"),
    Case("model-txt-file", "{eval} --model {M_txt}", 2, "is a file but not a .gguf file"),
    Case("model-missing-local", "{eval} --model ./no/such/model", 2, "does not exist"),
    Case("model-empty", "{eval} --model=", 2, "--model is empty"),
    Case("model-config-only-experts", "{experts} --model {M_cfg}", 2, "no weights"),
    Case("model-empty-gguf-align", "{align} --model {G_empty}", 2, "is empty"),
    # ---- output folder
    Case("out-current-folder", "{eval} --out .", 2, "is the current folder"),
    Case("out-parent-folder", "{lens} --out ..", 2, "current folder or one of its parents"),
    Case("out-space", "{eval} --out ' '", 2, "--out is empty"),
    Case("out-file-experts", "{experts} --out {a_file}", 2, "is an existing file"),
    Case("out-file-build", "{build} --out {a_file}", 2, "is an existing file"),
    Case("out-file-sub-align", "{align} --out {a_file}/x/y", 2, "is a file, so no folder"),
    Case("out-file-sub-trace", "{trace} --out {a_file}/x", 2, "is a file, so no folder"),
    Case("out-read-only-build", "{build} --out ro/v", 2, "is not writable", setup=_ro),
    Case(
        "out-foreign-build",
        "{build} --out {foreign}",
        2,
        "non-empty folder that mechlingo did not write",
    ),
    Case(
        "out-foreign-experts",
        "{experts} --out {foreign}",
        2,
        "non-empty folder that mechlingo did not write",
    ),
    # ---- facts files
    Case("data-missing", "{eval} --facts {missing}", 2, "does not exist"),
    Case("data-csv", "{eval} --facts {csv}", 2, "unknown facts file extension '.csv'"),
    Case("data-bad-json", "{eval} --facts {badjson}", 2, "line 2: invalid json"),
    Case("data-missing-field", "{eval} --facts {nofield}", 2, "line 1: field 'answer' is missing"),
    Case("data-unknown-lang", "{eval} --facts {badlang}", 2, "unknown language 'xx'"),
    Case("data-duplicate", "{eval} --facts {dup}", 2, "line 2: field 'id' repeats"),
    Case("data-trailing-space", "{eval} --facts {trailing}", 2, "ends with whitespace"),
    Case("data-not-object", "{eval} --facts {notobj}", 2, "expected an object"),
    Case("data-blank-lines", "{eval} --facts {blank_jsonl}", 2, "holds no facts"),
    Case("data-latin1-tsv", "{lens} --facts {latin1_tsv}", 2, "latin1.tsv, line 3: byte 0xe9"),
    Case("data-empty-flag", "{eval} --facts=", 2, "--facts is empty"),
    Case("data-dir-trace", "{trace} --facts {dir_jsonl}", 2, "is a folder"),
    Case("data-empty-build", "{build} --facts {empty_jsonl}", 2, "holds no facts"),
    Case(
        "context-trace", "{trace} --facts {long} --langs en,fr", 2, "more than the model's context"
    ),
    Case("context-names-fact", "{eval} --facts {long} --langs en,fr", 2, "in "),
    Case("context-max-new-tokens", "{eval} --max-new-tokens 600", 2, "new tokens"),
    # ---- text folders (experts, align)
    Case("text-misaligned", "{experts} --parallel {par_misaligned}", 2, "not line-aligned"),
    Case("text-empty-dir", "{experts} --parallel {par_empty}", 2, "no file for language(s)"),
    Case(
        "text-file-not-dir",
        "{experts} --parallel {par_file}",
        2,
        "is a file; --parallel takes a folder",
    ),
    Case("text-missing-dir", "{align} --parallel {missing}", 2, "does not exist"),
    Case(
        "text-missing-lang",
        "{align} --parallel {par} --langs en,de",
        2,
        "no file for language(s) ['de']",
    ),
    Case("text-latin1-align", "{align} --parallel {par_latin1}", 2, "es.txt, line 4: byte 0xe9"),
    # a sentence longer than the context is cut to --max-tokens (at most the context less
    # BOS; 64 by default), so only --max-tokens itself can pass the context
    Case(
        "text-context",
        "{align} --parallel {par_long} --max-tokens 100000",
        2,
        "--max-tokens 100000 + BOS is more than the model's context",
    ),
    Case("text-max-tokens-over-ctx", "{experts} --max-tokens 600", 2, "--max-tokens 600 + bos"),
    # ---- saved artifacts
    Case("clamp-missing", "{align} --clamp {C_missing}", 2, "does not exist"),
    Case("clamp-file", "{align} --clamp {C_file}", 2, "is not a folder"),
    Case("clamp-empty-st", "{align} --clamp {C_empty_st}", 2, "not a valid safetensors"),
    Case("clamp-no-kind", "{align} --clamp {C_nokind}", 2, "'kind'"),
    Case(
        "clamp-unknown-kind", "{align} --clamp {C_badkind}", 2, "unknown intervention kind 'magic'"
    ),
    Case("clamp-json-list", "{align} --clamp {C_list}", 2, "does not hold a json object"),
    Case("clamp-format", "{align} --clamp {C_format}", 2, "unsupported format 99"),
    Case("clamp-no-json", "{align} --clamp {C_nojson}", 2, "holds no saved intervention"),
    Case("clamp-latin1-json", "{align} --clamp {C_latin1}", 2, "not valid json"),
    Case("control-truncated", "{align} --control {C_trunc}", 2, "truncated"),
    Case("control-missing", "{align} --control {C_missing}", 2, "does not exist"),
    Case("vectors-missing", "{steer-eval} --vectors {V_missing}", 2, "does not exist"),
    Case("vectors-no-diff", "{steer-eval} --vectors {V_nodiff}", 2, "holds no saved intervention"),
    Case(
        "vectors-bad-build-json",
        "{steer-eval} --vectors {V_badbuild}",
        2,
        "build.json is not valid json",
    ),
    Case(
        "vectors-bad-task-json",
        "{steer-eval} --vectors {V_badjson}",
        2,
        "intervention.json is not valid json",
    ),
    Case("vectors-is-clamp", "{steer-eval} --vectors {C}", 2, "task holds no saved intervention"),
    # ---- sizes: a prompt past the context is refused after the model loads, before a pass
    Case(
        "lens-prompt-past-context",
        "lens --model {T} --quiet --prompt 'hi' --prompt '" + "word " * 300 + "'",
        2,
        "--prompt 2 is",
    ),
    # ---- command line shape
    Case("steer-no-subcommand", "steer", 2, "use `mechlingo steer build"),
    Case("unknown-flag", "{eval} --bogus 1", 2, ""),
    Case("experts-no-lang", "experts --model {T} --out o", 2, ""),
]


def _expand(case: Case, P: dict[str, str]) -> list[str]:
    import shlex

    text = case.argv
    for name, base in BASE.items():
        text = text.replace("{" + name + "}", base)
    argv = [a.format(**P) for a in shlex.split(text)]
    if not any(a == "--out" or a.startswith("--out=") for a in argv) and case.argv != "steer":
        argv += ["--out", "out"]
    return argv


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_cli_case(case: Case, P, sandbox, capsys, monkeypatch):
    work, cache = sandbox
    if case.setup is not None:
        case.setup(monkeypatch, work)
    argv = _expand(case, P)
    before = snapshot(work, cache)
    code = run_cli(argv)
    err = capsys.readouterr().err
    assert code == case.code, f"{argv}: exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    if case.code == 2 and case.fragment:
        assert case.fragment.lower() in err.lower(), err
    if case.code == 2 and "usage:" not in err:
        lines = [ln for ln in err.splitlines() if ln.startswith("mechlingo")]
        assert len(lines) == 1, err  # one line: what, where, what to do
    if case.code == 0:
        out = work / argv[argv.index("--out") + 1]
        for name in case.ok_outputs:
            assert (out / name).exists(), sorted(p.name for p in out.iterdir())
        assert snapshot(cache) == {k: v for k, v in before.items() if k.startswith(str(cache))}
        assert not [p.name for p in work.rglob(".*") if ".building-" in p.name]
    else:
        assert snapshot(work, cache) == before, "the working folder or the cache changed"


def test_table_size():
    assert len(CASES) >= 140
    assert sum(c.id.startswith("reported-") for c in CASES) >= 36


# --------------------------------------------------------------------------------------
# The library table: interventions, loaders, hierarchy
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_b(P):
    from mechlingo.core.models import load_model

    model = load_model(P["T_B"], device="cpu")
    model.cfg.model_name = "mechlingo-tiny-gemma3-b"
    return model


def _sv(**kw: Any) -> Any:
    from mechlingo.interventions import SteeringVector

    return SteeringVector(torch.ones(64), 0, **kw)


def _meta_b(tiny_b: Any) -> dict:
    from mechlingo.interventions import model_info

    return {"model": model_info(tiny_b)}


def _lib_intervene_b(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.interventions import intervene

    with intervene(tiny, _sv(meta=_meta_b(tiny_b))):
        pass


def _lib_run_with_hooks_b(tiny: Any, tiny_b: Any, P: Any) -> None:
    tiny.run_with_hooks(tiny.to_tokens("x"), fwd_hooks=_sv(meta=_meta_b(tiny_b)).fwd_hooks(tiny))


def _lib_clamp_b(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.interventions import NeuronClamp

    NeuronClamp({0: [1]}, 1.0, meta=_meta_b(tiny_b)).fwd_hooks(tiny)


def _lib_compose_b(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.interventions import Ablation

    (Ablation("resid_pre", 0) + _sv(meta=_meta_b(tiny_b))).fwd_hooks(tiny)


def _lib_load(name: str) -> Any:
    def fn(tiny: Any, tiny_b: Any, P: Any) -> None:
        from mechlingo.interventions import load_intervention

        load_intervention(P[name], tiny)

    return fn


def _lib_steer_b_on_a(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.analyses.recall.steering import SteeringPair

    SteeringPair.load(P["V_B"], tiny)


def _call(fn_text: str) -> Any:
    def fn(tiny: Any, tiny_b: Any, P: Any) -> None:
        from mechlingo.interventions import Ablation, NeuronClamp, SteeringVector  # noqa: F401

        eval(fn_text)

    return fn


def _lib_read(name: str) -> Any:
    def fn(tiny: Any, tiny_b: Any, P: Any) -> None:
        from mechlingo.data import read_facts

        read_facts(P[name])

    return fn


def _lib_dtype_nn(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.core.models import load_model

    load_model(P["T"], device="cpu", dtype="nn")


def _lib_align_target(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.analyses.experts.align import compare_alignment

    compare_alignment(tiny, {"en": ["a b", "c d"], "fr": ["e f", "g h"]}, None, target="xx")


def _lib_context(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.cli.validate import check_context

    check_context(tiny, [("fact 'it' (en)", "word " * 600)], new_tokens=8)


def _lib_write_onto_file(tiny: Any, tiny_b: Any, P: Any) -> None:
    from mechlingo.report import write_outputs

    write_outputs(P["a_file"], {"summary.json": {}})


LIB_CASES: list[tuple[str, Any, str, str]] = [
    # (id, call, error class name, message fragment)
    (
        "reported-alpha-nan",
        _call("SteeringVector(torch.ones(64), 0, alpha=float('nan'))"),
        "InterventionError",
        "nan",
    ),
    (
        "reported-alpha-inf",
        _call("SteeringVector(torch.ones(64), 0, alpha=float('inf'))"),
        "InterventionError",
        "infinite",
    ),
    (
        "alpha-neg-inf",
        _call("SteeringVector(torch.ones(64), 0, alpha=-float('inf'))"),
        "InterventionError",
        "infinite",
    ),
    (
        "alpha-at-nan",
        _call("SteeringVector(torch.ones(2, 64)).at(0, float('nan'))"),
        "InterventionError",
        "nan",
    ),
    (
        "vector-nan",
        _call("SteeringVector(torch.full((64,), float('nan')), 0)"),
        "InterventionError",
        "nan",
    ),
    (
        "reported-clamp-nan",
        _call("NeuronClamp({0: [1, 2]}, float('nan'))"),
        "InterventionError",
        "nan",
    ),
    (
        "clamp-inf-list",
        _call("NeuronClamp({0: [1, 2]}, [1.0, float('inf')])"),
        "InterventionError",
        "infinite",
    ),
    (
        "clamp-nan-mapping",
        _call("NeuronClamp({0: [1]}, {0: [float('nan')]})"),
        "InterventionError",
        "nan",
    ),
    (
        "clamp-nan-scale",
        _call("NeuronClamp({0: [1]}, float('nan'), 'scale')"),
        "InterventionError",
        "nan",
    ),
    (
        "reported-clamp-duplicate-neuron",
        _call("NeuronClamp({0: [3, 3]}, [1.0, 100.0])"),
        "InterventionError",
        "neuron 3 appears more than once",
    ),
    (
        "clamp-duplicate-tensor",
        _call("NeuronClamp({1: torch.tensor([5, 2, 5])}, 0.0)"),
        "InterventionError",
        "neuron 5",
    ),
    (
        "clamp-duplicate-default-values",
        _call("NeuronClamp({0: [7, 7]})"),
        "InterventionError",
        "more than once",
    ),
    (
        "reported-ablation-mean-nan",
        _call("Ablation('resid_pre', 0, 'mean', mean=torch.full((64,), float('nan')))"),
        "InterventionError",
        "nan",
    ),
    (
        "ablation-mean-inf",
        _call("Ablation('resid_pre', 0, 'mean', mean=torch.full((64,), float('inf')))"),
        "InterventionError",
        "infinite",
    ),
    (
        "reported-intervene-other-model",
        _lib_intervene_b,
        "ModelMismatchError",
        "unembed_fingerprint",
    ),
    (
        "reported-fwd-hooks-other-model",
        _lib_run_with_hooks_b,
        "ModelMismatchError",
        "unembed_fingerprint",
    ),
    ("clamp-fwd-hooks-other-model", _lib_clamp_b, "ModelMismatchError", "unembed_fingerprint"),
    ("compose-other-model", _lib_compose_b, "ModelMismatchError", "unembed_fingerprint"),
    ("load-other-model", _lib_load("C_B"), "ModelMismatchError", "unembed_fingerprint"),
    ("vectors-other-model", _lib_steer_b_on_a, "ModelMismatchError", "unembed_fingerprint"),
    (
        "load-corrupt-json",
        _lib_load("C_badjson"),
        "ArtifactError",
        "intervention.json is not valid JSON",
    ),
    ("load-truncated", _lib_load("C_trunc"), "ArtifactError", "truncated"),
    ("load-zeroed", _lib_load("C_zero"), "ArtifactError", "not a valid safetensors"),
    ("load-no-mode", _lib_load("C_nomode"), "ArtifactError", "'mode'"),
    ("load-missing", _lib_load("C_missing"), "MissingArtifactError", "holds no saved intervention"),
    ("read-latin1", _lib_read("latin1_jsonl"), "DataError", "line 3: byte 0xe9"),
    ("read-empty", _lib_read("empty_jsonl"), "DataError", "holds no facts"),
    ("read-header-only", _lib_read("header_tsv"), "DataError", "header line but no facts"),
    ("read-dir", _lib_read("dir_jsonl"), "DataError", "is a folder"),
    ("dtype-nn", _lib_dtype_nn, "ModelLoadError", "unknown dtype 'nn'"),
    ("align-target-unknown", _lib_align_target, "AlignmentError", "target 'xx'"),
    ("context-length", _lib_context, "ContextLengthError", "fact 'it' (en)"),
    ("write-outputs-onto-file", _lib_write_onto_file, "OutputError", "is an existing file"),
]


@pytest.mark.parametrize("cid,call,cls,fragment", LIB_CASES, ids=[c[0] for c in LIB_CASES])
def test_library_case(cid, call, cls, fragment, tiny, tiny_b, P):
    from mechlingo.core.errors import MechlingoError

    with pytest.raises(MechlingoError) as info:
        call(tiny, tiny_b, P)
    assert type(info.value).__name__ == cls, repr(info.value)
    assert fragment.lower() in str(info.value).lower()


def test_loaded_intervention_without_model_warns(tiny, P):
    from mechlingo.interventions import load_intervention

    with pytest.warns(UserWarning, match="records no model"):
        load_intervention(P["C_nomodel"], tiny)


def test_same_model_still_applies(tiny, P):
    """The fingerprint check does not refuse the model the artifact was built on."""
    from mechlingo.interventions import intervene, load_intervention

    iv = load_intervention(P["C"], tiny)
    with intervene(tiny, iv):
        tiny(tiny.to_tokens("The capital"))
    assert iv.fwd_hooks(tiny)


def test_error_hierarchy_keeps_old_bases():
    from mechlingo.analyses.experts import ExpertError
    from mechlingo.analyses.experts.align import AlignmentError
    from mechlingo.analyses.recall.patching import PatchingError
    from mechlingo.cli import UsageError
    from mechlingo.core.distributed import DistributedError
    from mechlingo.core.errors import MechlingoError, MissingArtifactError
    from mechlingo.core.models import ModelLoadError
    from mechlingo.core.sites import SiteError
    from mechlingo.core.tokens import TokenizationError
    from mechlingo.data import RecordError
    from mechlingo.interventions import InterventionError, ModelMismatchError

    for cls in (AlignmentError, RecordError, ExpertError, InterventionError, ModelMismatchError,
                PatchingError, SiteError, TokenizationError, UsageError):  # fmt: skip
        assert issubclass(cls, MechlingoError) and issubclass(cls, ValueError), cls
    for cls in (ModelLoadError, DistributedError):
        assert issubclass(cls, MechlingoError) and issubclass(cls, RuntimeError), cls
    assert issubclass(MissingArtifactError, FileNotFoundError)


def test_unexpected_exception_is_reported_as_a_bug(P, sandbox, capsys, monkeypatch):
    import mechlingo.cli.lens

    def boom(*a: Any, **k: Any) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(mechlingo.cli.lens, "lens_facts", boom)
    code = run_cli(_expand(Case("x", "{lens}", 1, ""), P))
    err = capsys.readouterr().err
    assert code == 1
    bug = err.index("this is a bug in mechlingo")
    assert bug < err.index("Traceback") < err.index("ZeroDivisionError: boom")


def test_issue14_steering_last_on_right_padded_batch(tiny):
    """``run_with_hooks`` with ``positions="last"`` on a right-padded batch refuses without
    the row lengths, and steers each row at its last real token when given the batch."""
    from mechlingo.core.tokens import encode
    from mechlingo.interventions import InterventionError, SteeringVector

    sv = SteeringVector(torch.randn(64) * 5, 1, positions="last")
    short, long = "Rome", "The capital of Italy is the city of"
    batch = encode(tiny, [short, long])
    with pytest.raises(InterventionError, match="fwd_hooks_for"):
        tiny.run_with_hooks(
            batch.tokens, attention_mask=batch.attention_mask(), fwd_hooks=sv.fwd_hooks(tiny)
        )
    padded = tiny.run_with_hooks(
        batch.tokens,
        attention_mask=batch.attention_mask(),
        fwd_hooks=sv.fwd_hooks_for(tiny, batch),
    )
    alone = encode(tiny, [short])
    single = tiny.run_with_hooks(alone.tokens, fwd_hooks=sv.fwd_hooks(tiny))
    n = alone.tokens.shape[1]
    assert torch.allclose(padded[0, n - 1], single[0, n - 1], atol=1e-4)


# --------------------------------------------------------------------------------------
# Kill tests: SIGKILL in the middle of a write leaves the old folder or the new one
# --------------------------------------------------------------------------------------


def _killed(code: str, env_kill: str, cwd: Path) -> None:
    """Run ``code`` as a script in ``cwd`` in a forked child of the test process, which must
    die by SIGKILL at the kill point ``env_kill``. The child is killed as a new interpreter
    would be (its files stay as the kill left them), without importing the package and its
    libraries again; its output goes to a log beside ``cwd``."""
    log = cwd.parent / f"{cwd.name}-killed.log"

    def run() -> None:
        os.chdir(cwd)
        exec(compile(textwrap.dedent(code), "<killed>", "exec"), {"__name__": "__main__"})

    code_ = fork_call(run, log, {"MECHLINGO_TEST_KILL_AT": env_kill}, timeout=300)
    assert code_ == -signal.SIGKILL, log.read_text()[-3000:]


_WRITE = """
from mechlingo.report import write_outputs
write_outputs("out", {"summary.json": {"new": True}, "report.html": "new", "extra.csv": "a,b"})
"""


def _old_out(work: Path) -> dict:
    (work / "out").mkdir(parents=True)
    (work / "out" / "summary.json").write_text('{"old": true}')
    (work / "out" / "report.html").write_text("old report")
    (work / "out" / "keep.txt").write_text("kept")
    return snapshot(work / "out")


def _leftovers(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("point", ["write", "fill"])
def test_kill_during_write_outputs_keeps_old_folder(tmp_path, point):
    from mechlingo.core.artifacts import cleanup_stale

    old = _old_out(tmp_path)
    _killed(_WRITE, point, tmp_path)
    assert snapshot(tmp_path / "out") == old
    assert _leftovers(tmp_path), "the killed write should have left its temporary folder"
    cleanup_stale(tmp_path, "out")
    assert _leftovers(tmp_path) == []
    assert snapshot(tmp_path / "out") == old


def test_kill_after_swap_gives_new_folder(tmp_path):
    _old_out(tmp_path)
    _killed(_WRITE, "publish", tmp_path)
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text()) == {"format_version": 1, "new": True}
    assert (out / "report.html").read_text() == "new"
    assert (out / "keep.txt").read_text() == "kept"  # other files carried over


def test_kill_between_fallback_renames_restores_old(tmp_path):
    """Without renameat2 the swap is two renames; a kill between them is repaired at the
    next start (the old folder is put back)."""
    from mechlingo.core.artifacts import cleanup_stale

    old = _old_out(tmp_path)
    code = "import mechlingo.core.artifacts as a\na._exchange = lambda x, y: False\n" + _WRITE
    _killed(code, "publish", tmp_path)
    assert not (tmp_path / "out").exists()
    cleanup_stale(tmp_path, "out")
    assert snapshot(tmp_path / "out") == old
    assert _leftovers(tmp_path) == []


def test_kill_during_intervention_save_keeps_old(tmp_path):
    from mechlingo.interventions import SteeringVector, load_intervention

    SteeringVector(torch.ones(64), 0, alpha=1.0).save(tmp_path / "iv")
    old = snapshot(tmp_path / "iv")
    code = """
    import torch
    from mechlingo.interventions import SteeringVector
    SteeringVector(torch.zeros(64), 1, alpha=2.0).save("iv")
    """
    _killed(code, "fill", tmp_path)
    assert snapshot(tmp_path / "iv") == old
    assert load_intervention(tmp_path / "iv").alpha == 1.0


def test_kill_during_steer_build_keeps_old_vectors(P, tmp_path):
    """A SIGKILL during `steer build --out VDIR` leaves the old VDIR (never task/ of one run
    next to build.json of another); the next start removes the leftover."""
    vdir = tmp_path / "vectors"
    shutil.copytree(P["V"], vdir)
    old = snapshot(vdir)
    code = f"""
    from mechlingo.cli import main
    main(["steer", "build", "--model", {P["T_B"]!r}, "--langs", "en,fr", "--limit", "16",
          "--out", "vectors", "--quiet", "--split", "0.6,0.2,0.2"])
    """
    _killed(code, "fill", tmp_path)
    assert snapshot(vdir) == old
    assert any(".building-" in n for n in _leftovers(tmp_path))
    from mechlingo.core.artifacts import cleanup_stale

    cleanup_stale(tmp_path, "vectors")
    assert _leftovers(tmp_path) == []


def test_failed_steer_build_keeps_old_vectors(P, sandbox, capsys, monkeypatch):
    """A build that fails after writing task/ leaves the old folder as it was."""
    from mechlingo.analyses.recall.steering import SteeringPair
    from mechlingo.core.errors import ArtifactError

    work, _ = sandbox
    vdir = work / "vectors"
    shutil.copytree(P["V"], vdir)
    old = snapshot(vdir)

    def half_save(self: Any, folder: Any, model: Any = None) -> None:
        self.task.save(Path(folder) / "task", model)
        raise ArtifactError("disk full (simulated)")

    monkeypatch.setattr(SteeringPair, "save", half_save)
    argv = _expand(Case("x", "{build}", 2, ""), P)
    argv[argv.index("--out") + 1] = "vectors"
    assert run_cli(argv) == 2
    assert "disk full" in capsys.readouterr().err
    assert snapshot(vdir) == old
    assert not [p for p in work.iterdir() if ".building-" in p.name]


def test_stale_cache_build_folders_are_removed_at_start(P, sandbox):
    work, cache = sandbox
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = cache / f".building-{dead.pid}-abc"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"x" * 1000)
    old_no_pid = cache / ".building-xyz"
    old_no_pid.mkdir()
    os.utime(old_no_pid, (0, 0))
    live = cache / f".building-{os.getpid()}-live"
    live.mkdir()
    stale_rename = cache / f"gemma-3-270m.stale-{dead.pid}"
    stale_rename.mkdir()
    assert run_cli(_expand(Case("x", "{eval}", 0, ""), P)) == 0
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted(["gemma-3-270m", live.name])
    assert (cache / "gemma-3-270m" / "sentinel").read_text() == "cached"


# --------------------------------------------------------------------------------------
# Every integer flag is bounded before anything it sizes is allocated
# --------------------------------------------------------------------------------------


def _int_flags() -> list[tuple[tuple[str, ...], str, str]]:
    """``(subcommand path, flag, dest)`` of every integer-typed flag of the parser."""
    import argparse

    from mechlingo.cli.flags import count_or_all
    from mechlingo.cli.main import build_parser

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Any:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))
            elif action.type in (int, count_or_all):
                yield path, action.option_strings[0], action.dest

    return list(walk(build_parser(), ()))


@pytest.mark.parametrize("value", [2_000_000_000, 10**12])
def test_every_integer_flag_is_bounded_before_the_model_loads(value, tiny_dir, sandbox, capsys,
                                                              monkeypatch):  # fmt: skip
    from mechlingo.cli import common

    def no_load(*a: Any, **k: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(common, "load_model", no_load)
    flags = _int_flags()
    assert len(flags) > 40
    need = {("experts",): ["--target", "es"]}
    for path, flag, dest in flags:
        if dest == "seed":
            continue  # any 64-bit integer is a seed
        argv = [*path, "--model", str(tiny_dir), *need.get(path, []), flag, str(value),
                "--out", "out"]  # fmt: skip
        t0 = time.perf_counter()
        code = run_cli(argv)
        err = capsys.readouterr().err
        assert code == 2, f"{argv}: exit {code}\n{err[-2000:]}"
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err[-2000:]
        assert time.perf_counter() - t0 < 10, argv


def test_every_integer_flag_has_a_bound():
    from mechlingo.cli.flags import INT_LIMITS, UNBOUNDED_INTS

    assert {d for _, _, d in _int_flags()} <= set(INT_LIMITS) | set(UNBOUNDED_INTS)


def test_integer_bounds_are_inclusive():
    import argparse

    from mechlingo.cli.flags import INT_LIMITS, check_int_limits
    from mechlingo.core.errors import InputError

    for dest, (high, _) in INT_LIMITS.items():
        check_int_limits(argparse.Namespace(**{dest: high}))
        check_int_limits(argparse.Namespace(**{dest: -high}))
        with pytest.raises(InputError, match=f"more than {high:,}"):
            check_int_limits(argparse.Namespace(**{dest: high + 1}))
