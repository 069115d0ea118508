"""The run-time checker of the test suite's shape checks (installed by ``conftest.py`` with
jaxtyping's import hook on the ``mechlingo`` package).

jaxtyping's ``jaxtyped`` calls a *type checker* on a stand-in of each function's parameters
and return value, inside a context that remembers the size bound to every named axis for
the duration of one call. For the package's plain functions, :func:`checked_function` does
the same checks in one wrapper of its own (jaxtyping's memo, jaxtyping's ``isinstance``),
a fraction of jaxtyping's cost per call; classes and other callables keep jaxtyping's
wrapper with :func:`arrays_only`. Both check exactly the jaxtyping annotations there
(``Float[Tensor, "batch pos d_model"]``, also inside ``X | None`` and other unions): when a
value is a tensor or an array, it must match one of the array annotations (dtype, rank, and
the axes consistent across the call's arguments and result). Other annotations (``Model``,
``Sequence[float]``, ...) are left to mypy: full run-time checking with beartype would also
reject duck-typed stand-ins that the functions accept on purpose.

A mismatched *argument* is held back until the function has run: a function that refuses it
with its own error (an ``InputError`` naming the flag or the fix, which the bad-input tests
expect) raises that; one that returns anyway fails the check after it returns. So the
checks add to the package's own validation, and never replace its messages.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
import typing
from typing import Any

import jaxtyping
import jaxtyping._decorator as jaxtyping_decorator
import jaxtyping._import_hook as jaxtyping_import_hook
import numpy as np
import torch
from jaxtyping import AbstractArray
from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

_DEFERRED = "__mechlingo_deferred_violation__"
# (module, qualname) -> whether jaxtyping checks the call again after it returns
_HAS_RETURN_STAGE: dict[tuple[str, str], bool] = {}

_ARRAYS = (torch.Tensor, np.ndarray)


def _alternatives(hint: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(hint)
    return (hint,)


def _array_hints(hint: Any) -> tuple[type, ...] | None:
    """The jaxtyping classes among a hint's alternatives; ``None`` when the hint has none or
    also allows ``Any`` (nothing to check)."""
    alts = _alternatives(hint)
    if any(a is Any or a is object for a in alts):
        return None
    found = tuple(a for a in alts if isinstance(a, type) and issubclass(a, AbstractArray))
    return found or None


def _problem(fn_name: str, what: str, value: Any, allowed: tuple[type, ...]) -> str | None:
    if not isinstance(value, _ARRAYS) or any(isinstance(value, a) for a in allowed):
        return None
    names = " | ".join(a.__name__ for a in allowed)
    return f"{fn_name}: {what} is {value.dtype} {tuple(value.shape)}, not {names}"


def _is_return_stage(sig: inspect.Signature) -> bool:
    """jaxtyping's stand-in for the check after the call has one extra keyword-only
    parameter (the return value, annotated ``Any``) and the real return annotation."""
    last = list(sig.parameters.values())[-1:] or [None]
    p = last[0]
    return (
        p is not None
        and p.kind == inspect.Parameter.KEYWORD_ONLY
        and p.name.startswith("ret")
        and p.annotation is Any
    )


def arrays_only(fn: Any) -> Any:
    """Wrap jaxtyping's stand-in ``fn`` so that each call checks the array-annotated
    arguments (before the call, held back as described above) and result (after it)."""
    sig = inspect.signature(fn)
    key = (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn)))
    after = _is_return_stage(sig)
    if after:
        _HAS_RETURN_STAGE[key] = sig.return_annotation is not inspect.Signature.empty
    params = {n: h for n, p in sig.parameters.items() if (h := _array_hints(p.annotation))}
    ret = _array_hints(sig.return_annotation) if after else None
    if not params and ret is None:
        return fn
    name = key[1]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        memo = get_shape_memo()[0]
        bound = sig.bind(*args, **kwargs)
        problems = [
            _problem(name, f"parameter {pname!r}", bound.arguments[pname], allowed)
            for pname, allowed in params.items()
            if pname in bound.arguments
        ]
        problem = next((p for p in problems if p), None) or memo.get(_DEFERRED)
        out = fn(*args, **kwargs)
        if after and ret is not None and problem is None:
            problem = _problem(name, "the return value", out, ret)
        if problem is not None:
            if not after and _HAS_RETURN_STAGE.get(key, False):
                memo[_DEFERRED] = problem  # raised after the call unless it refuses itself
            else:
                raise TypeError(problem)
        return out

    return checked


_ORIGINAL_JAXTYPED = jaxtyping_decorator.jaxtyped
_SENTINEL = jaxtyping_decorator._sentinel
# code object -> whether a function with that code has an array annotation
_HAS_ARRAYS: dict[types.CodeType, bool] = {}


def _annotates_arrays(fn: types.FunctionType) -> bool:
    """Whether a parameter or the return of ``fn`` has a jaxtyping array annotation, the
    annotations read as jaxtyping reads them (unresolvable ones count as ``Any``)."""
    code = fn.__code__
    if code not in _HAS_ARRAYS:
        hints = [
            jaxtyping_decorator._destring_annotation(ann, fn.__globals__)
            for ann in getattr(fn, "__annotations__", {}).values()
        ]
        _HAS_ARRAYS[code] = any(_array_hints(h) is not None for h in hints)
    return _HAS_ARRAYS[code]


_MISSING = object()
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _hint(fn: types.FunctionType, annotation: Any) -> tuple[type, ...] | None:
    if annotation is inspect.Signature.empty:
        return None
    return _array_hints(jaxtyping_decorator._destring_annotation(annotation, fn.__globals__))


def checked_function(fn: types.FunctionType) -> Any:
    """``fn`` checked as :func:`arrays_only` checks jaxtyping's stand-ins, in one wrapper.

    Each call opens a jaxtyping shape memo (the axes bound by the arguments hold for the
    result), checks the array-annotated arguments, runs ``fn`` and checks its result; an
    argument's mismatch is raised once ``fn`` has returned (``fn``'s own error first). It is
    what ``jaxtyping.jaxtyped(fn, typechecker=arrays_only)`` checks, without that wrapper's
    three signature binds and two stand-in calls per call."""
    sig = inspect.signature(fn)
    checks = []  # (name, position or None, default, allowed)
    variadic = False
    for i, (pname, p) in enumerate(sig.parameters.items()):
        allowed = _hint(fn, p.annotation)
        if allowed is None:
            continue
        variadic = variadic or p.kind in _VARIADIC
        default = _MISSING if p.default is inspect.Parameter.empty else p.default
        checks.append((pname, i if p.kind in _POSITIONAL else None, default, allowed))
    ret = _hint(fn, sig.return_annotation)
    if not checks and ret is None:
        return fn
    name = fn.__qualname__

    def values(args: tuple, kwargs: dict) -> list[tuple[str, Any, tuple[type, ...]]]:
        if variadic:  # *args or **kwargs annotated: each of their values is checked
            bound = sig.bind(*args, **kwargs)
            out = []
            for pname, _, _, allowed in checks:
                value = bound.arguments.get(pname, _MISSING)
                kind = sig.parameters[pname].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    out += [(f"{pname}[{j}]", v, allowed) for j, v in enumerate(value or ())]
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    out += [(f"{pname}[{k!r}]", v, allowed) for k, v in (value or {}).items()]
                else:
                    out.append((pname, value, allowed))
            return out
        return [
            (pname, args[i] if i is not None and i < len(args) else kwargs.get(pname, default),
             allowed)
            for pname, i, default, allowed in checks
        ]  # fmt: skip

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        push_shape_memo({})
        try:
            problem = None
            for pname, value, allowed in values(args, kwargs):
                found = None
                if value is not _MISSING:  # every one is checked: each binds its axes
                    found = _problem(name, f"parameter {pname!r}", value, allowed)
                problem = problem or found
            out = fn(*args, **kwargs)
            if problem is None and ret is not None:
                problem = _problem(name, "the return value", out, ret)
            if problem is not None:
                raise TypeError(problem)
            return out
        finally:
            pop_shape_memo()

    return checked


#: the dotted name conftest.py gives jaxtyping's import hook
HOOK_CHECKER = "tests.shape_checks.arrays_only"


def _hook_trampoline() -> Any:
    """What the import hook passes as the checker for :data:`HOOK_CHECKER`: a function that
    imports it by name and calls it (``jaxtyping._import_hook.Typechecker``)."""
    digest = hashlib.md5(HOOK_CHECKER.encode("utf-8")).hexdigest()
    return jaxtyping_import_hook.Typechecker.lookup.get(digest)


def _jaxtyped_where_arrays(fn: Any = _SENTINEL, *, typechecker: Any = _SENTINEL) -> Any:
    """``jaxtyping.jaxtyped``, except for plain functions: one without array annotations is
    returned unwrapped (:func:`arrays_only` checks nothing there) and one with them is
    wrapped by :func:`checked_function`. jaxtyping's wrapper costs three signature binds and
    two stand-in calls per call, and a compile per definition (nested functions are redefined
    on every call of their parent)."""
    if fn is _SENTINEL:
        return functools.partial(_jaxtyped_where_arrays, typechecker=typechecker)
    if isinstance(fn, types.FunctionType):
        if not _annotates_arrays(fn):
            return fn
        if typechecker is arrays_only or typechecker is _hook_trampoline():
            return checked_function(fn)
    return _ORIGINAL_JAXTYPED(fn, typechecker=typechecker)


def skip_unannotated() -> None:
    """Route the import hook's ``@jaxtyping.jaxtyped`` (and jaxtyping's own recursion into
    dataclass ``__init__``) through :func:`_jaxtyped_where_arrays`; call before the hook."""
    jaxtyping.jaxtyped = _jaxtyped_where_arrays
    jaxtyping_decorator.jaxtyped = _jaxtyped_where_arrays
