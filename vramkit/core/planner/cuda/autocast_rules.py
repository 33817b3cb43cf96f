"""CUDA's autocast, applied to CPU tensors, so a CPU trace casts exactly as a GPU run would.

`torch.autocast("cuda")` turns itself off on a CPU build, and CPU autocast follows different op
lists (it leaves `exp`, `sum`, `softmax`, `layer_norm`, the upsampling ops… alone, and casts
`cat`, `stack` and the FFTs that CUDA does not touch). `CudaAutocast` re-registers, for the
duration of a trace, the `AutocastCPU` dispatch kernel of every op in CUDA's lists with a Python
kernel that applies CUDA's policy, and makes every op only CPU autocast knows fall through.
Casts of fp32 leaf tensors that require grad (the weights) are cached until the autocast region
ends, as CUDA's weight-cast cache does: under `16-mixed` every weight's fp16 copy stays alive
through the forward pass.

The lists are those of ATen's `autocast_mode.h` (the same in torch 2.13 and 2.14), plus the ops a
torch version or a CUDA build registers outside them (`SINCE_VERSION_OPS`, `CUDA_BUILD_OPS`;
docs/cuda_rules.md lists the rows that differ). `policy_ops` models the CUDA build of the installed
torch's version: on a CUDA build it reads which ops autocast handles from the installed torch
(`registered_cuda_ops`), on a CPU build from the table.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from packaging.version import Version
from torch.utils._pytree import tree_flatten, tree_map

from vramkit.core.planner.cuda.kernel_overrides import KernelOverrides
from vramkit.core.planner.cuda.tested_torch import is_cuda_build

LOWER_PRECISION_OPS = (
    "_convolution",
    "_convolution.deprecated",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)
"""Ops CUDA autocast runs in the lower precision (fp16 or bf16)."""

FP32_OPS = (
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
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "rms_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
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
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
"""Ops CUDA autocast runs in fp32."""

FP32_SET_OPT_DTYPE_OPS = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)
"""Ops with an optional output dtype that CUDA autocast sets to fp32 when the caller did not."""

FP32_APPEND_DTYPE_OPS = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
"""Overloads without a dtype that CUDA autocast redirects to their fp32-dtype overload."""

PROMOTE_OPS = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)
"""Ops CUDA autocast runs in the widest floating dtype among their inputs."""

BANNED_OPS = ("binary_cross_entropy",)
"""Ops CUDA autocast refuses (they are unsafe in fp16)."""

SINCE_VERSION_OPS = {"linalg_matrix_sqrth": ("fp32", (2, 14))}
"""Ops `autocast_mode.cpp` registers outside the header's lists: op → (policy, first torch
(major, minor) that has the op). `linalg_matrix_sqrth` is new in 2.14; its kernels take no 16-bit
input, so CUDA autocast runs it in fp32 (checked on fake CUDA tensors, test_cuda_rules.py)."""

CUDNN_RNN = "cudnn_rnn_fp16"
"""Policy of `_cudnn_rnn` (`aten/src/ATen/cudnn/AutocastRNN.cpp`): input, hx and cx cast to fp16
whatever the autocast dtype, the weights copied into one flat fp16 buffer on every call."""

CUDA_BUILD_OPS = {"_cudnn_rnn": CUDNN_RNN}
"""Ops only a CUDA build (compiled with cuDNN) registers a CUDA autocast kernel for. A CPU trace
never calls `_cudnn_rnn` (an LSTM runs its cell composite there, whose `linear`s the
lower-precision rule casts), so `CudaAutocast` installs no kernel for it."""

_AUTOCAST_CPU = torch._C.DispatchKey.AutocastCPU
_AUTOCAST_CPU_KEYS = torch._C.DispatchKeySet(_AUTOCAST_CPU)


def cuda_autocast_table(version: str | None = None, *, cuda_build: bool = True) -> dict[str, str]:
    """CUDA autocast's ops → policy name for torch `version` (default: the installed one).

    `cuda_build=False` gives what a CPU build of that version registers: no cuDNN ops.
    """
    release = Version(torch.__version__ if version is None else version).release[:2]
    policies: dict[str, str] = {}
    for names, policy in (
        (LOWER_PRECISION_OPS, "lower_precision"),
        (FP32_OPS, "fp32"),
        (FP32_SET_OPT_DTYPE_OPS, "fp32_set_opt_dtype"),
        (tuple(FP32_APPEND_DTYPE_OPS), "fp32_append_dtype"),
        (PROMOTE_OPS, "promote"),
        (BANNED_OPS, "banned"),
    ):
        policies.update(dict.fromkeys(names, policy))
    for name, (policy, since) in SINCE_VERSION_OPS.items():
        if release >= since:
            policies[name] = policy
    if cuda_build:
        policies.update(CUDA_BUILD_OPS)
    return policies


def policy_ops() -> dict[str, str]:
    """The ops the planner applies CUDA autocast to, mapped to their policy names.

    They model the CUDA build of the installed torch's version: on a CUDA build, the ops it
    registers (their policies from the table); on a CPU build, the table's rows for that build.
    """
    table = cuda_autocast_table()
    if not is_cuda_build():
        return table
    return {name: table[name] for name in sorted(registered_cuda_ops()) if name in table}


def unmodelled_cuda_ops() -> frozenset[str]:
    """Ops the installed torch's CUDA autocast handles that the table has no policy for."""
    return registered_cuda_ops() - set(cuda_autocast_table(cuda_build=is_cuda_build()))


@functools.cache
def _registered(dispatch_key: str) -> frozenset[str]:
    names = torch._C._dispatch_get_all_op_names()
    return frozenset(
        name.removeprefix("aten::")
        for name in names
        if name.startswith("aten::")
        and torch._C._dispatch_has_kernel_for_dispatch_key(name, dispatch_key)
    )


def registered_cuda_ops() -> frozenset[str]:
    """Op names the installed torch registers a CUDA autocast kernel for (e.g. "conv2d")."""
    return _registered("AutocastCUDA")


def registered_cpu_ops() -> frozenset[str]:
    """Op names the installed torch registers a CPU autocast kernel for."""
    return _registered("AutocastCPU")


def _op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _eligible(value: Any) -> bool:
    # CUDA's rule ("a floating CUDA tensor that is not double") with CPU standing in for CUDA.
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


class CudaAutocast:
    """CUDA autocast semantics for CPU tensors while the context is entered.

    `region()` is one `torch.autocast` block (Lightning wraps each training and validation step
    in one): inside it the policies apply; leaving it empties the weight-cast cache.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"autocast lower precision must be float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._overrides = KernelOverrides()

    def __enter__(self) -> CudaAutocast:
        policies = policy_ops()
        kernels = {
            name: self._kernel(name, policy)
            for name, policy in policies.items()
            if policy != CUDNN_RNN
        }
        # The CPU's own autocast kernels of ops CUDA autocast leaves alone fall through.
        for name in registered_cpu_ops() - set(policies):
            kernels[name] = torch.library.fallthrough_kernel
        self._overrides.register(kernels, "AutocastCPU")
        # Real autocast empties its weight-cast cache whenever the outermost autocast region
        # exits (torch/amp/autocast_mode.py, `__exit__`: `torch.clear_autocast_cache()` once
        # `_decrement_autocast_nesting()` reaches 0), including the region that
        # torch.utils.checkpoint opens to recompute a segment inside backward. The emulated
        # cache follows every such clearing.
        self._clear_real_cache = torch.clear_autocast_cache
        torch.clear_autocast_cache = self._clear_caches
        return self

    def __exit__(self, *exc: object) -> None:
        if self._overrides.remove():
            torch.clear_autocast_cache = self._clear_real_cache
        self._cache.clear()

    def _clear_caches(self) -> None:
        self._clear_real_cache()
        self._cache.clear()

    @contextlib.contextmanager
    def region(self) -> Iterator[None]:
        """One autocast block: casting on inside, the weight-cast cache emptied on the way out."""
        if not self._overrides.active:
            raise RuntimeError("CudaAutocast.region() needs the CudaAutocast context entered")
        try:
            with torch.autocast("cpu", dtype=self.dtype):
                yield
        finally:
            self._cache.clear()

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = (
            dtype == self.dtype
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
        )
        if cacheable:
            hit = self._cache.get(id(value))
            if hit is not None and hit[0]() is value:
                return hit[1]
        cast = value.to(dtype)
        if cacheable:
            self._cache[id(value)] = (weakref.ref(value), cast)
        return cast

    def _cast_all(self, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        return tree_map(lambda v: self._cast(v, dtype), (args, kwargs))

    def _promote_type(self, args: tuple, kwargs: dict) -> torch.dtype:
        widest = self.dtype
        for value in tree_flatten((args, kwargs))[0]:
            if not _eligible(value):
                continue
            if widest == torch.float32 or value.dtype == torch.float32:
                widest = torch.float32
            elif value.dtype != self.dtype:
                raise RuntimeError(
                    f"autocast cannot promote {value.dtype} together with {self.dtype}"
                )
        return widest

    def _kernel(self, name: str, policy: str) -> Callable[..., Any]:
        op = _op(name)
        if policy == "banned":

            def banned(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(
                    f"aten::{name} is unsafe under CUDA autocast (fp16 cannot hold its inputs "
                    "safely); use binary_cross_entropy_with_logits (BCEWithLogitsLoss), which "
                    "autocast runs in fp32"
                )

            return banned
        if policy == "fp32_append_dtype":
            target = _op(FP32_APPEND_DTYPE_OPS[name])
            defaults = [arg.default_value for arg in op._schema.arguments]

            def append_dtype(*args: Any, **kwargs: Any) -> Any:
                with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU_KEYS):
                    values = list(args) + [
                        kwargs.get(arg.name, defaults[i])
                        for i, arg in enumerate(op._schema.arguments)
                        if i >= len(args)
                    ]
                    dtype = torch.float32 if _eligible(values[0]) else values[0].dtype
                    return target(*values, dtype=dtype)

            return append_dtype
        if policy == "fp32_set_opt_dtype":
            names = [arg.name for arg in op._schema.arguments]
            dtype_index = names.index("dtype")

            def set_opt_dtype(*args: Any, **kwargs: Any) -> Any:
                with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU_KEYS):
                    if _eligible(args[0]):
                        if dtype_index < len(args):
                            if args[dtype_index] is None:
                                args = (
                                    *args[:dtype_index],
                                    torch.float32,
                                    *args[dtype_index + 1 :],
                                )
                        elif kwargs.get("dtype") is None:
                            kwargs = {**kwargs, "dtype": torch.float32}
                    return op(*args, **kwargs)

            return set_opt_dtype

        def cast_inputs(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU_KEYS):
                if policy == "lower_precision":
                    dtype = self.dtype
                elif policy == "fp32":
                    dtype = torch.float32
                else:
                    dtype = self._promote_type(args, kwargs)
                args, kwargs = self._cast_all(args, kwargs, dtype)
                return op(*args, **kwargs)

        return cast_inputs
