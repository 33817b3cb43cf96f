"""The LLM fine-tuning options of ``vramkit plan --hf`` and ``vramkit.plan_hf(...)``, as the
``task=causal_lm`` overrides they stand for.

Each option is checked here, before any composing or tracing, and a bad value is one message
naming the option and the closest valid value (`FinetuneOptionError`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramkit.core.config.source import closest
from vramkit.core.hardware.profile import PRECISIONS

METHODS = ("full", "lora", "qlora")
"""What trains: every weight, LoRA adapters, LoRA adapters over a 4-bit base."""
QUANT_TYPES = ("nf4", "fp4")
"""bitsandbytes' 4-bit data types."""
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a 4-bit layer computes in."""
OPTIMIZERS: dict[str, tuple[str, ...]] = {
    # torch's AdamW (foreach kernels)
    "adamw": ("model.optimizer._target_=torch.optim.AdamW",),
    # torch's AdamW with its fused kernel (one launch for every parameter)
    "adamw_fused": ("model.optimizer._target_=torch.optim.AdamW", "+model.optimizer.fused=true"),
    # bitsandbytes' block-wise 8-bit AdamW (pip install 'vramkit[bnb]')
    "adamw_8bit": ("model.optimizer._target_=bitsandbytes.optim.AdamW8bit",),
    # the same with its state in CUDA unified memory, paged to the host under pressure
    "paged_adamw_8bit": ("model.optimizer._target_=bitsandbytes.optim.PagedAdamW8bit",),
    # transformers' Adafactor with a set learning rate (factored second moments, no first)
    "adafactor": (
        "model.optimizer._target_=transformers.optimization.Adafactor",
        "+model.optimizer.scale_parameter=false",
        "+model.optimizer.relative_step=false",
        "+model.optimizer.warmup_init=false",
    ),
}
"""``--optimizer``: the ``model.optimizer`` overrides of each name (train.py takes the same)."""
LORA_TARGETS_ALL = "all-linear"


class FinetuneOptionError(ValueError):
    """A fine-tuning option with a bad value; the message names the option and the closest."""


def _one_of(option: str, value: str, choices: tuple[str, ...] | list[str]) -> str:
    if value in choices:
        return value
    near = closest(str(value), list(choices))
    hint = f"; did you mean {near}?" if near else ""
    raise FinetuneOptionError(f"{option} {value}: not one of {', '.join(choices)}{hint}")


@dataclass(frozen=True)
class FinetuneOptions:
    """How a causal LM is fine-tuned, in the words of the command line (None: the task's
    default, conf/model/causal_lm.yaml)."""

    method: str = "lora"
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] | None = None
    """Linear layer names, or ("all-linear",)."""
    quant_type: str | None = None
    double_quant: bool | None = None
    compute_dtype: str | None = None
    gradient_checkpointing: bool = False
    optimizer: str | None = None
    precision: str | None = None

    def check(self) -> FinetuneOptions:
        """These options, or a `FinetuneOptionError` naming the first bad one."""
        _one_of("--finetune", self.method, METHODS)
        if self.lora_r is not None and self.lora_r < 1:
            raise FinetuneOptionError(f"--lora-r {self.lora_r}: an adapter rank is at least 1")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise FinetuneOptionError(f"--lora-alpha {self.lora_alpha}: must be above 0")
        if self.lora_targets is not None and not all(self.lora_targets):
            raise FinetuneOptionError(
                "--lora-targets: give Linear layer names separated by commas, or all-linear"
            )
        if self.quant_type is not None:
            _one_of("--quant-type", self.quant_type, QUANT_TYPES)
        if self.compute_dtype is not None:
            _one_of("--compute-dtype", self.compute_dtype, COMPUTE_DTYPES)
        if self.optimizer is not None:
            _one_of("--optimizer", self.optimizer, list(OPTIMIZERS))
        if self.precision is not None:
            _one_of("--precision", self.precision, PRECISIONS)
        quantized = (self.quant_type, self.double_quant, self.compute_dtype)
        if self.method != "qlora" and any(value is not None for value in quantized):
            raise FinetuneOptionError(
                "--quant-type, --no-double-quant and --compute-dtype apply to --qlora only"
            )
        adapters = (self.lora_r, self.lora_alpha, self.lora_targets)
        if self.method == "full" and any(value is not None for value in adapters):
            raise FinetuneOptionError(
                "--lora-r, --lora-alpha and --lora-targets apply to --lora and --qlora only"
            )
        return self

    def overrides(self) -> list[str]:
        """The ``task=causal_lm`` Hydra overrides these options stand for (after `check`)."""
        out = [f"model.finetune={self.method}"]
        if self.lora_r is not None:
            out.append(f"model.lora.r={self.lora_r}")
        if self.lora_alpha is not None:
            out.append(f"model.lora.alpha={self.lora_alpha}")
        if self.lora_targets is not None:
            targets = self.lora_targets
            value = LORA_TARGETS_ALL if LORA_TARGETS_ALL in targets else f"[{','.join(targets)}]"
            out.append(f"model.lora.target_modules={value}")
        if self.quant_type is not None:
            out.append(f"model.qlora.quant_type={self.quant_type}")
        if self.double_quant is not None:
            out.append(f"model.qlora.double_quant={str(self.double_quant).lower()}")
        if self.compute_dtype is not None:
            out.append(f"model.qlora.compute_dtype={self.compute_dtype}")
        return out + self.common_overrides()

    def common_overrides(self) -> list[str]:
        """The overrides of the options every Hugging Face plan takes (not only a fine-tune):
        gradient checkpointing, the optimizer and the precision."""
        out = []
        if self.gradient_checkpointing:
            out.append("model.gradient_checkpointing=true")
        if self.optimizer is not None:
            out.extend(OPTIMIZERS[self.optimizer])
        if self.precision is not None:
            out.append(f"hw.precision={self.precision}")
        return out
