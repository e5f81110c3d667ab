# ruff: noqa  (a sampler of syntax, never run: its oddities are the point)
"""Syntax that src/ uses or may come to use, valid under Python 3.10 (pyproject's floor): its code
hash must be the same under every Python (tests/pipeline/test_fingerprints_pythons.py). Never imported."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Config:
    """A docstring."""

    name: str
    sizes: tuple[int, ...] = (1, 2)
    extra: dict[str, Any] = field(default_factory=dict)
    maybe: int | None = None
    later: list[str]


class Child(Config, metaclass=type):
    pass


def positional(a, b=1, /, c=2, *args, d, e=3, **kwargs) -> int | None:
    global COUNTER
    x: int
    y: float = 1.5e-3
    z = 2 + 3j
    (p, *rest), q = [1, 2, 3], b"bytes"
    COUNTER = a if a > b >= c else -a
    COUNTER += 1
    del x
    assert COUNTER, "message"

    def inner():
        nonlocal y
        y **= 2
        return lambda u, *v, w=1, **k: (u, v, w, k)

    return inner


async def agen(items):
    async with contextlib.AsyncExitStack() as stack, contextlib.AsyncExitStack():
        async for i in items:
            yield await stack.enter_async_context(i)


def generator(xs):
    yield from (x for x in xs if x)
    return [y for y in xs], {y for y in xs}, {y: y for y in xs}, xs[::2], xs[1:-1], xs[...]


def strings(name, width, value, d):
    a = f"{name!r:>{width}} {value:.3f} {value=} {d['key']} {'nested'} {{braces}}"
    b = f"plain" "implicit" f"{name}" "single" """triple"""
    c = rf"\d{width}" + Rb"\x00".decode() + "".join([f"{x:,}" for x in range(3)])
    d = f"{name}{value:{width}.{width}}{'a' if value else 'b'}{(lambda: 1)()}"
    return a, b, c, d, f"", f"{''}", f"{name:}"


def control(value, xs):
    try:
        match value:
            case {"kind": "a", **rest}:
                return rest
            case [first, *others] if first:
                return others
            case Config(name="x") | Child():
                return None
            case str() as s:
                return s
            case _:
                pass
    except (ValueError, KeyError) as e:
        raise RuntimeError("wrapped") from e
    except Exception:
        raise
    else:
        while (n := len(xs)) > 3:
            xs = xs[1:]
            if n == 5:
                continue
            break
        else:
            return n
    finally:
        for i, x in enumerate(xs):
            print(i, x, *xs, sep="", **{"end": ""})
    with open("a") as f, open("b"):
        return f
