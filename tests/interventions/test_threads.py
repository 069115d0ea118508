"""One model, two threads, as an attacker (or a thread pool) arranges it: TransformerLens
hooks belong to the model, so a second thread's intervention while the first one's hooks are
on is refused, nothing it would have attached stays, and the first thread's numbers are its
own; one ``intervene()`` block entered inside itself is refused with one line."""

from __future__ import annotations

import threading

import pytest
import torch

import mechlingo
from mechlingo.activations.runs import run_batch
from mechlingo.core.errors import InterventionError
from mechlingo.core.tokens import encode
from mechlingo.interventions import SteeringVector
from tests.conftest import count_hooks

PROMPTS = ["The capital of France is", "Water boils at"]


def _vector(seed: int, layer: int, model) -> SteeringVector:
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(seed))
    return SteeringVector(v, layer, 4.0, positions="all")


def test_a_second_thread_cannot_put_hooks_on_a_model_in_use(tiny):
    """Thread A is inside ``intervene`` (blocked there); the main thread's own intervention,
    and a mechlingo pass, are refused with one line, attach nothing, and a plain pass of the
    main thread is not edited by A's hooks. A's own pass gives A's numbers; after A leaves,
    no hook is left and the main thread may intervene."""
    b = encode(tiny, PROMPTS)
    mask = b.attention_mask()
    with torch.no_grad():
        clean = tiny(b.tokens, attention_mask=mask)
        with mechlingo.intervene(tiny, _vector(1, 0, tiny), batch=b):
            want_a = tiny(b.tokens, attention_mask=mask)
    assert not torch.allclose(want_a, clean)
    inside, leave = threading.Event(), threading.Event()
    got: dict[str, object] = {}

    def thread_a() -> None:
        try:
            with torch.no_grad(), mechlingo.intervene(tiny, _vector(1, 0, tiny), batch=b):
                got["hooks"] = count_hooks(tiny)
                inside.set()
                assert leave.wait(60)
                got["a"] = tiny(b.tokens, attention_mask=mask)
        except BaseException as err:  # noqa: BLE001 - reported below
            got["error"] = err
            inside.set()

    a = threading.Thread(target=thread_a, name="thread-a")
    a.start()
    try:
        assert inside.wait(60) and "error" not in got, got
        before = count_hooks(tiny)
        with pytest.raises(InterventionError) as err:
            with mechlingo.intervene(tiny, _vector(2, 1, tiny), batch=b):
                pytest.fail("the second thread's block ran")
        assert "another thread ('thread-a')" in str(err.value) and "\n" not in str(err.value)
        assert count_hooks(tiny) == before  # nothing of the refused block attached
        with pytest.raises(InterventionError):
            run_batch(tiny, b)  # a mechlingo pass would run A's hooks: refused as well
        with torch.no_grad():
            mine = tiny(b.tokens, attention_mask=mask)  # a plain pass: A's hooks stay out
        torch.testing.assert_close(mine, clean, rtol=0, atol=0)
    finally:
        leave.set()
        a.join(60)
    assert "error" not in got, got
    torch.testing.assert_close(got["a"], want_a, rtol=0, atol=0)
    assert count_hooks(tiny) == 0
    with torch.no_grad(), mechlingo.intervene(tiny, _vector(2, 1, tiny), batch=b):
        assert count_hooks(tiny) == got["hooks"]
    assert count_hooks(tiny) == 0


def test_one_block_entered_inside_itself_is_refused(tiny):
    """``with block: with block:`` is one line (not an AttributeError), the outer block's
    hooks stay on until it ends; the same block used again after it ends works."""
    b = encode(tiny, PROMPTS)
    block = mechlingo.intervene(tiny, _vector(3, 1, tiny), batch=b)
    with torch.no_grad():
        with block:
            n = count_hooks(tiny)
            with pytest.raises(InterventionError, match="already active") as err:
                with block:
                    pytest.fail("entered twice")
            assert "\n" not in str(err.value)
            assert count_hooks(tiny) == n
            first = tiny(b.tokens, attention_mask=b.attention_mask())
        assert count_hooks(tiny) == 0
        with block:
            again = tiny(b.tokens, attention_mask=b.attention_mask())
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert count_hooks(tiny) == 0


def test_different_blocks_nest_in_one_thread(tiny):
    """Two blocks nested in one thread act together, as their sum does, and leave no hook."""
    b = encode(tiny, PROMPTS)
    mask = b.attention_mask()
    one, two = _vector(4, 0, tiny), _vector(5, 1, tiny)
    with torch.no_grad():
        with mechlingo.intervene(tiny, one, batch=b), mechlingo.intervene(tiny, two, batch=b):
            nested = tiny(b.tokens, attention_mask=mask)
            inner = run_batch(tiny, b)  # a mechlingo pass inside: the same thread
        with mechlingo.intervene(tiny, one + two, batch=b):
            summed = tiny(b.tokens, attention_mask=mask)
    torch.testing.assert_close(nested, summed, rtol=0, atol=0)
    torch.testing.assert_close(inner, summed, rtol=0, atol=0)
    assert count_hooks(tiny) == 0
