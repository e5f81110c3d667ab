"""CUDA's bf16 autocast policy, applied to CPU tensors: a rehearsal of what a GPU run's dtypes do.

`torch.autocast("cuda")` disables itself without CUDA, and CPU autocast follows other op lists (its
layer_norm, cumsum and sum keep bf16, CUDA's give fp32), so neither shows on a CPU what the first
GPU run will meet. `CudaAutocast` is a TorchFunctionMode that casts per the op lists of ATen's
autocast_mode.cpp for CUDA:

  lower_precision_fp   matmul family, linear, convolutions, sdpa      -> inputs cast to bf16
  fp32                 pointwise transcendental ops, norms, losses    -> inputs cast to fp32
  fp32_set_opt_dtype   sum, cumsum, prod, softmax, log_softmax, ...   -> dtype=float32 when the
                                                                         first input is floating
  promote              cat, stack, addcmul, index_put, ...            -> the widest float dtype
  banned               binary_cross_entropy                           -> error, as on CUDA
  everything else                                                     -> its inputs' dtypes

Eligible inputs are floating-point tensors other than float64, as in ATen. Ops are matched by their
Python-level name (torch.sum and Tensor.sum alike); a composite such as cross_entropy is given the
policy of its first autocast-listed ATen op. What it cannot see: code that turns autocast off with
torch.autocast(enabled=False) (only export's pre-dispatch mode is told), so our code never relies on
that; and the backward of an autograd.Function under custom_bwd (ours have none: their backward pins
its own dtypes).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

LOWER = {
    "linear",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "mm",
    "bmm",
    "baddbmm",
    "addmm",
    "addbmm",
    "addmv",
    "addr",
    "mv",
    "einsum",
    "chain_matmul",
    "multi_dot",
    "vecdot",
    "prelu",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_tbc",
    "scaled_dot_product_attention",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
}
FP32 = {
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "__pow__",
    "__rpow__",
    "__rtruediv__",
    "__rdiv__",
    "softplus",
    "layer_norm",
    "group_norm",
    "norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "cross_entropy",
}
FP32_SET_OPT_DTYPE = {
    "sum",
    "prod",
    "cumsum",
    "cumprod",
    "softmax",
    "log_softmax",
    "vector_norm",
    "matrix_norm",
}
PROMOTE = {
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "grid_sampler",
    "index_put",
    "scatter_add",
    "tensordot",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "index_copy",
}
BANNED = {"binary_cross_entropy"}


def eligible(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


def _cast(tree, dtype):
    return tree_map(lambda x: x.to(dtype) if eligible(x) and x.dtype != dtype else x, tree)


def _first_tensor(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


class CudaAutocast(TorchFunctionMode):
    """`with CudaAutocast():` runs its body as under torch.autocast("cuda", torch.bfloat16)."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.dtype = dtype
        self.seen = set()  # names of the listed ops that ran under it (for the tests' sanity)
        self.lowered = []  # (op, output dtype) of each lower-precision op on eligible inputs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in LOWER:
            eligible_in = any(eligible(x) for x in tree_flatten_tensors((args, kwargs)))
            args, kwargs = _cast(args, self.dtype), _cast(kwargs, self.dtype)
            if eligible_in:
                self.seen.add(name)
                out = func(*args, **kwargs)
                self.lowered.append((name, getattr(out, "dtype", None)))
                return out
        elif name in FP32:
            args, kwargs = _cast(args, torch.float32), _cast(kwargs, torch.float32)
        elif name in FP32_SET_OPT_DTYPE:
            if eligible(_first_tensor(args, kwargs)) and kwargs.get("dtype") is None:
                kwargs["dtype"] = torch.float32
        elif name in PROMOTE:
            floats = [x.dtype for x in tree_flatten_tensors((args, kwargs)) if eligible(x)]
            if floats:
                widest = max(floats, key=lambda d: torch.finfo(d).bits)
                args, kwargs = _cast(args, widest), _cast(kwargs, widest)
        elif name in BANNED:
            raise RuntimeError(f"torch.nn.functional.{name} is unsafe to autocast (as on CUDA)")
        else:
            return func(*args, **kwargs)
        self.seen.add(name)
        return func(*args, **kwargs)


def tree_flatten_tensors(tree) -> list:
    out = []
    tree_map(lambda x: out.append(x) if isinstance(x, torch.Tensor) else None, tree)
    return out


class _LowerProbe(TorchFunctionMode):
    """Records the output dtype of each lower-precision op that ran on eligible inputs."""

    def __init__(self, lowered: list):
        super().__init__()
        self.lowered = lowered

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in LOWER and any(eligible(x) for x in tree_flatten_tensors((args, kwargs or {}))):
            self.lowered.append((name, getattr(out, "dtype", None)))
        return out


class cpu_bf16_autocast:
    """The real CPU autocast, for the same tests under PyTorch's own (CPU) op lists, with a probe of
    what its lower-precision ops produced."""

    def __init__(self):
        self.lowered = []
        self._autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        self._probe = _LowerProbe(self.lowered)

    def __enter__(self):
        self._autocast.__enter__()
        self._probe.__enter__()
        return self

    def __exit__(self, *exc):
        self._probe.__exit__(*exc)
        return self._autocast.__exit__(*exc)


class Recorded:
    """A factory for runtime.AUTOCAST that keeps every context it made, so that a test can assert
    afterwards that the policy ran: it was entered, lower-precision ops ran under it on eligible
    inputs, and each of them produced the policy's dtype."""

    def __init__(self, factory, dtype=torch.bfloat16):
        self.factory, self.dtype, self.made = factory, dtype, []
        self.expect_lowered = True  # False: the code under test is documented to compute in fp32

    def __call__(self):
        ctx = self.factory()
        self.made.append(ctx)
        return ctx

    def check(self) -> None:
        lowered = [x for ctx in self.made for x in ctx.lowered]
        assert self.made, "the step never entered runtime.autocast: the policy did not run"
        if self.expect_lowered:
            assert lowered, (
                "no lower-precision op ran under the policy: the rehearsal rehearsed nothing"
            )
        wrong = sorted({f"{op} -> {dtype}" for op, dtype in lowered if dtype != self.dtype})
        assert not wrong, f"lower-precision ops did not produce {self.dtype}: {wrong}"


# name -> factory of the context a "cpu" device's steps run under (grassflow.runtime.AUTOCAST)
POLICIES = {"cuda-rules": CudaAutocast, "cpu-bf16": cpu_bf16_autocast}
