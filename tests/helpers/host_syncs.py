"""A detector of host syncs: every read of a tensor's value by the host, the way a CUDA run would
have to wait for the device to make it.

On the CPU such reads never reach the dispatcher as a sync (`.tolist()`, `.numpy()`, `.cpu()` of a
CPU tensor dispatch nothing), so they are caught at the Python level, as Tensor methods through a
TorchFunctionMode: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `bool()` (a tensor in an `if`),
`float()`, `int()`, use as an index, `np.asarray()`, formatting. ATen's own scalar reads
(`_local_scalar_dense`, `is_nonzero`) are counted at the dispatcher too, for the ones that bypass
Python. Not counted: `.to("cpu")`, which on a CPU run cannot be told apart from moving host data
onto the device; our code reads back with `.cpu()` or `.tolist()`.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

READS = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__array__",
    "__format__",
    "__repr__",
}
ATEN_READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default"}


class _PythonReads(TorchFunctionMode):
    def __init__(self, seen: Counter):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


class _AtenReads(TorchDispatchMode):
    def __init__(self, seen: Counter):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in ATEN_READS:
            self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


class HostSyncs:
    """`with HostSyncs() as s:` … `s.n` reads, `s.seen` by kind."""

    def __init__(self):
        self.seen = Counter()
        self._stack = ExitStack()

    @property
    def n(self) -> int:
        return sum(self.seen.values())

    def __enter__(self):
        self._stack.enter_context(_PythonReads(self.seen))
        self._stack.enter_context(_AtenReads(self.seen))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)
