"""Which engine runs the network in ``python eval.py``: PyTorch, or onnxruntime on an export.

``backend=torch`` loads ``ckpt_path`` into the configured model. ``backend=onnxruntime`` runs the
exported ``onnx_path`` inside the same LightningModule: the task names, in its config's
``onnx_backend`` node, a function ``(module, onnx_path=...) -> module`` that swaps its network
for an onnxruntime session, so validation, post-processing and the prediction writer are the
same code for both backends and their metrics compare directly. Core stays workload-neutral: it
only instantiates that node.
"""

from __future__ import annotations

from typing import Any, Literal

from omegaconf import DictConfig

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import ConfigPath, Settings
from vramkit.core.config.source import ConfigSource, command_line_overrides
from vramkit.core.run.checkpoint_setting import checkpoint_setting

BACKEND_KEYS = ("backend", "ckpt_path", "onnx_path", "onnx_threads")


class EvalBackendSettings(Settings):
    """The keys of conf/eval.yaml that choose what is evaluated."""

    backend: Literal["torch", "onnxruntime"] = "torch"
    """torch: the checkpoint in PyTorch; onnxruntime: the exported model."""
    ckpt_path: ConfigPath | None = None
    """The checkpoint (required with backend=torch)."""
    onnx_path: ConfigPath | None = None
    """The exported model (required with backend=onnxruntime)."""
    onnx_threads: int | None = None
    """onnxruntime intra-op threads; null: one per core."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """The file the chosen backend reads must be given and exist."""
        key, path = (
            ("ckpt_path", self.ckpt_path)
            if self.backend == "torch"
            else ("onnx_path", self.onnx_path)
        )
        if path is None:
            return [(key, f"required with backend={self.backend}")]
        if not path.is_file():
            return [(key, f"no file at {path}")]
        return []


def backend_settings(cfg: DictConfig) -> EvalBackendSettings:
    """The backend keys of ``cfg``, checked (a `ConfigError` names the key and conf/eval.yaml)."""
    return EvalBackendSettings.from_config(
        {key: cfg.get(key) for key in BACKEND_KEYS if cfg.get(key) is not None},
        key_prefix="",
        source=ConfigSource("conf/eval.yaml", command_line_overrides()),
        title="invalid evaluation settings",
    )


def prepare_model(cfg: DictConfig, model: Any, settings: EvalBackendSettings) -> Any:
    """``model`` ready for the backend: the checkpoint's weights loaded (backend=torch), or its
    network swapped for the export (backend=onnxruntime, whose weights are the export's).

    The checkpoint is read here, once, through `checkpoint_setting` (weights only: tensors and
    plain values, no code; any other file is refused naming ``ckpt_path``), rather than by
    ``trainer.validate(ckpt_path=...)`` and again by
    ``trainer.predict``: Lightning would also restore the training callbacks' states and
    warn, twice, that the callbacks which wrote them are missing, which evaluation never needs.
    """
    if settings.backend == "torch":
        checkpoint = checkpoint_setting("ckpt_path", settings.ckpt_path, mmap=False)
        # as strictly as Lightning's own loading (a LightningModule's strict_loading)
        strict = getattr(model, "strict_loading", True)
        model.load_state_dict(checkpoint["state_dict"], strict=strict)
        return model
    node = cfg.get("onnx_backend")
    if node is None:
        raise ConfigError(
            "invalid evaluation settings (conf/eval.yaml):\n  backend: onnxruntime is not "
            f"available for task {cfg.get('task_name')!r} (its config has no onnx_backend node); "
            "use backend=torch"
        )
    swap = instantiate(node, _partial_=True)
    return swap(model, onnx_path=settings.onnx_path, threads=settings.onnx_threads)
