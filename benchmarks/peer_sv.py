"""The steering-vectors side of ``bench_steering.py``; runs in the peer's own environment.

steering-vectors 0.12 needs transformers < 5, so it cannot share mechlingo's environment:
``scripts/build_peer_envs.sh sv`` builds ``.venv-sv``, and ``bench_steering.py`` runs this
script there with a JSON job (the model folder, the prompt pairs, the layer, alpha and the
prompts to steer) and reads back a torch file: the trained vectors of every layer, the
steered last-token logits and the timings. It imports nothing from mechlingo.

    .venv-sv/bin/python benchmarks/peer_sv.py JOB.json OUT.pt
"""

from __future__ import annotations

import json
import sys
import time

import torch
from steering_vectors import SteeringVector, train_steering_vector
from transformers import AutoModelForCausalLM, AutoTokenizer


def last_logits(model, tok, prompts: list[str], batch_size: int) -> torch.Tensor:
    """Logits at each prompt's last token (left padding), float32 ``[n, vocab]``."""
    tok.padding_side = "left"
    out = []
    for i in range(0, len(prompts), batch_size):
        enc = tok(prompts[i : i + batch_size], return_tensors="pt", padding=True)
        out.append(model(**enc).logits[:, -1].float())
    return torch.cat(out)


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(job["folder"])
    model = AutoModelForCausalLM.from_pretrained(job["folder"], torch_dtype=torch.float32).eval()
    bs = job["batch_size"]
    for key in ("task_pairs", "diff_pairs"):  # JSON lists back to the (positive, negative) tuples
        job[key] = [tuple(pair) for pair in job[key]]
    train_steering_vector(model, tok, job["task_pairs"][:2], layers=[0], batch_size=bs)  # warm-up
    t0 = time.perf_counter()
    task = train_steering_vector(model, tok, job["task_pairs"], batch_size=bs)
    diff = train_steering_vector(model, tok, job["diff_pairs"], batch_size=bs)
    t_build = time.perf_counter() - t0
    layer = job["hf_layer"]
    one = SteeringVector({layer: task.layer_activations[layer]}, task.layer_type)
    last_logits(model, tok, job["apply"][:2], bs)  # warm-up
    t0 = time.perf_counter()
    with one.apply(model, multiplier=job["alpha"]):
        steered = last_logits(model, tok, job["apply"], bs)
    t_apply = time.perf_counter() - t0
    torch.save(
        {
            "task": {k: v.float() for k, v in task.layer_activations.items()},
            "diff": {k: v.float() for k, v in diff.layer_activations.items()},
            "steered": steered,
            "t_build": t_build,
            "t_apply": t_apply,
        },
        sys.argv[2],
    )


if __name__ == "__main__":
    main()
