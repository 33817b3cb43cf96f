"""ResNet-18-style backbone for DBNet, written in plain torch, with a channel-width multiplier.

Parameter and buffer names follow torchvision's ``resnet18`` (``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer2.0.downsample.0`` ...), so at ``width=1.0`` a user who has a
torchvision ResNet-18 ``.pth`` file can load it with :func:`load_backbone_weights`. Nothing is
ever downloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from vramkit.core.config.schema import ConfigError
from vramkit.core.io.safe_load import UnreadableCheckpointError, load_weights_only

# Blocks per stage of ResNet-18.
RESNET18_LAYERS = (2, 2, 2, 2)

# Wrappers that training code puts in front of parameter names: DataParallel/DDP ("module."),
# torch.compile ("_orig_mod."), LightningModules holding the network as ``self.model``.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
_BACKBONE_PREFIX = "backbone."
_CLASSIFIER_PREFIX = "fc."  # the ImageNet classifier of a torchvision checkpoint: not ours
_SHOWN_KEYS = 5  # how many offending keys an error message lists


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetBackbone(nn.Module):
    """ResNet-18 trunk (no classifier) returning C2..C5 at strides 4, 8, 16, 32 px.

    ``width`` scales every channel count: the stem has ``round(64 * width)`` channels and the
    four stages ``c, 2c, 4c, 8c``. ``width=1.0`` is the standard ResNet-18 trunk
    (11,176,512 parameters); ``width=0.5`` has about a quarter of that.
    """

    def __init__(self, width: float = 1.0, layers: tuple[int, ...] = RESNET18_LAYERS) -> None:
        super().__init__()
        if not width > 0:
            raise ValueError(f"backbone width must be > 0, got {width}")
        if len(layers) != 4 or any(n < 1 for n in layers):
            raise ValueError(f"layers must be four positive block counts, got {layers}")
        base = max(1, round(64 * width))
        self.width = width
        self.conv1 = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

        stage_channels = tuple(base * 2**i for i in range(4))
        in_channels = base
        for index, (channels, blocks) in enumerate(zip(stage_channels, layers, strict=True)):
            first_stride = 1 if index == 0 else 2
            stage = [BasicBlock(in_channels, channels, first_stride)]
            stage += [BasicBlock(channels, channels) for _ in range(blocks - 1)]
            self.add_module(f"layer{index + 1}", nn.Sequential(*stage))
            in_channels = channels
        self.out_channels: tuple[int, int, int, int] = stage_channels
        self.strides: tuple[int, int, int, int] = (4, 8, 16, 32)

    def forward(self, images: Tensor) -> list[Tensor]:
        """Map images (B, 3, H, W) to ``[C2, C3, C4, C5]`` at H/4, H/8, H/16, H/32."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        c2 = self.layer1(x)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c2, c3, c4, c5]


class BackboneWeightsError(ConfigError):
    """A weights file that does not fit the backbone, or cannot be read weights-only: a refusal
    (one line, exit 2) whose message names the file and the keys."""


@dataclass(frozen=True)
class LoadedWeights:
    """What :func:`load_backbone_weights` did."""

    path: Path
    loaded: int  # tensors copied into the backbone
    missing: list[str]  # backbone keys the file lacked (only possible with strict=False)
    unexpected: list[str]  # file keys the backbone has no use for (only with strict=False)


def _unwrap_checkpoint(obj: object, path: Path) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise BackboneWeightsError(
            f"{path}: expected a state dict or a checkpoint dict, got {type(obj).__name__}"
        )
    for container in ("state_dict", "model"):
        inner = obj.get(container)
        if isinstance(inner, Mapping):
            return inner
    return obj


def _strip_prefix(key: str, prefixes: tuple[str, ...]) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in prefixes:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def _backbone_state(raw: Mapping[str, object], path: Path) -> dict[str, Tensor]:
    """Normalise key names to the backbone's own and drop what belongs to other modules."""
    renamed: dict[str, object] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise BackboneWeightsError(f"{path}: key {key!r} is not a string")
        renamed[_strip_prefix(key, _WRAPPER_PREFIXES)] = value
    # A whole-detector checkpoint: keep the backbone part only; the neck and head are not ours.
    if any(key.startswith(_BACKBONE_PREFIX) for key in renamed):
        renamed = {
            key[len(_BACKBONE_PREFIX) :]: value
            for key, value in renamed.items()
            if key.startswith(_BACKBONE_PREFIX)
        }
    state: dict[str, Tensor] = {}
    for key, value in renamed.items():
        if key.startswith(_CLASSIFIER_PREFIX):
            continue
        if not isinstance(value, Tensor):
            raise BackboneWeightsError(
                f"{path}: key {key!r} holds a {type(value).__name__}, not a tensor"
            )
        state[key] = value
    return state


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN_KEYS])
    more = len(keys) - _SHOWN_KEYS
    return shown + (f" ... and {more} more" if more > 0 else "")


def load_backbone_weights(
    backbone: ResNetBackbone, path: str | Path, *, strict: bool = True
) -> LoadedWeights:
    """Copy weights from a local file into ``backbone``; never downloads anything.

    The file may hold a plain state dict or a checkpoint dict with a ``"state_dict"`` or
    ``"model"`` entry. Prefixes ``module.``, ``_orig_mod.``, ``model.`` and ``backbone.`` are
    stripped (when ``backbone.`` keys exist, everything else, e.g. a DBNet neck and head, is
    ignored) and torchvision's classifier ``fc.*`` is dropped. BatchNorm's
    ``num_batches_tracked`` counters may be absent (old torchvision files lack them).

    Shape mismatches are always an error. With ``strict=True`` (the default) missing or
    unexpected keys are an error too; with ``strict=False`` they are reported in the result.
    Raises :class:`FileNotFoundError` or :class:`BackboneWeightsError`, whose message names the
    file and lists the first offending keys. The backbone is left untouched on error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"backbone weights file not found: {path}")
    try:
        # weights only: a weights file must not be able to run code when it is opened.
        obj = load_weights_only(path)
    except UnreadableCheckpointError as error:
        raise BackboneWeightsError(f"{error}; save the backbone's state_dict() alone") from None
    state = _backbone_state(_unwrap_checkpoint(obj, path), path)

    expected = backbone.state_dict()
    mismatched = [
        f"{key} (file {tuple(value.shape)}, backbone {tuple(expected[key].shape)})"
        for key, value in state.items()
        if key in expected and value.shape != expected[key].shape
    ]
    missing = [
        key for key in expected if key not in state and not key.endswith("num_batches_tracked")
    ]
    unexpected = [key for key in state if key not in expected]

    problems = []
    if mismatched:
        problems.append(f"shape mismatch for {len(mismatched)} keys: {_listing(mismatched)}")
    if strict and missing:
        problems.append(f"missing {len(missing)} keys: {_listing(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected {len(unexpected)} keys: {_listing(unexpected)}")
    if problems:
        hint = ""
        if mismatched:
            hint = f" (is the backbone width {backbone.width} the one the file was saved with?)"
        raise BackboneWeightsError(
            f"{path}: weights do not fit the backbone{hint}: " + "; ".join(problems)
        )

    usable = {key: value for key, value in state.items() if key in expected}
    backbone.load_state_dict(usable, strict=False)
    return LoadedWeights(path=path, loaded=len(usable), missing=missing, unexpected=unexpected)
