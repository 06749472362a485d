"""One check for every settings dataclass (the run, the policy, the scheduler, both learners):
each field's value has its declared type, is one of its choices, and lies within its bounds, or
the error names the field and what it must be, before anything runs."""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass

BIG = 10_000_000  # an upper bound that only stops nonsense
# (lower bound, is the lower bound allowed, upper bound (allowed)); NaN is outside every range
Bound = tuple[float, bool, float]


def type_problem(value, want) -> str | None:
    """What is wrong with ``value`` for annotation ``want`` (a string is not a bool, a bool is not a
    number; an int is accepted where a float is asked; ``X | None`` accepts None)."""
    allowed = (
        typing.get_args(want)
        if isinstance(want, types.UnionType) or typing.get_origin(want) is typing.Union
        else (want,)
    )
    for t in allowed:
        t = typing.get_origin(t) or t
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (
            (t is type(None) and value is None)
            or (t is float and number)
            or (t is int and number and isinstance(value, int))
            or (t in (str, bool, dict, list, tuple) and isinstance(value, t))
            or (is_dataclass(t) and isinstance(value, t))
        ):
            return None
    names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
    return f"expected {names}, got {type(value).__name__} {value!r}"


def check_settings(
    obj,
    where: str,
    bounds: dict[str, Bound] | None = None,
    choices: dict[str, tuple] | None = None,
    error: type[Exception] = ValueError,
) -> None:
    """Raise ``error`` naming ``{where}{field}`` for the first field of dataclass ``obj`` whose
    value has the wrong type, is not one of ``choices[field]`` or lies outside ``bounds[field]``
    (a field left None, where its type allows it, is not checked further)."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        if problem := type_problem(value, hints[f.name]):
            raise error(f"{where}{f.name}: {problem}")
        if value is None:
            continue
        if choices and f.name in choices and value not in choices[f.name]:
            raise error(f"{where}{f.name}: {value!r} is not one of {', '.join(map(str, choices[f.name]))}")
        if bounds and f.name in bounds:
            lo, lo_ok, hi = bounds[f.name]
            if not ((lo <= value if lo_ok else lo < value) and value <= hi):
                raise error(
                    f"{where}{f.name}: {value!r} must be a number in {'[' if lo_ok else '('}{lo}, {hi}]"
                )
