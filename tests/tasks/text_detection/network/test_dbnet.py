"""DBNet network: shapes, input checks, ResNet-18 parameter count, weight loading, overfitting."""

from __future__ import annotations

import pytest
import torch

from vramkit.tasks.text_detection.network.backbone import (
    BackboneWeightsError,
    ResNetBackbone,
    load_backbone_weights,
)
from vramkit.tasks.text_detection.network.dbnet import DBNet
from vramkit.tasks.text_detection.network.loss import DBLoss

# torchvision's resnet18 has 11,689,512 parameters; its classifier fc (512 -> 1000) has 513,000.
RESNET18_TRUNK_PARAMS = 11_689_512 - (512 * 1000 + 1000)


def _expected_trunk_params(width: float) -> int:
    """Count conv weights and BN affine parameters of a ResNet-18 trunk from its definition."""

    def conv(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k

    def bn(c: int) -> int:
        return 2 * c

    base = round(64 * width)
    total = conv(3, base, 7) + bn(base)
    cin = base
    for stage in range(4):
        cout = base * 2**stage
        for block in range(2):
            block_in = cin if block == 0 else cout
            total += conv(block_in, cout, 3) + bn(cout) + conv(cout, cout, 3) + bn(cout)
            if block == 0 and block_in != cout:
                total += conv(block_in, cout, 1) + bn(cout)
        cin = cout
    return total


def _torchvision_resnet18_trunk_keys() -> set[str]:
    """State-dict keys of torchvision's resnet18 without fc, spelled out from its naming."""
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    keys = {"conv1.weight", *(f"bn1.{name}" for name in bn)}
    for layer in range(1, 5):
        for block in range(2):
            prefix = f"layer{layer}.{block}"
            keys |= {f"{prefix}.conv1.weight", f"{prefix}.conv2.weight"}
            keys |= {f"{prefix}.bn{i}.{name}" for i in (1, 2) for name in bn}
            if layer > 1 and block == 0:
                keys.add(f"{prefix}.downsample.0.weight")
                keys |= {f"{prefix}.downsample.1.{name}" for name in bn}
    return keys


def _param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("width", "inner"), [(0.25, 64), (0.5, 128)])
@pytest.mark.parametrize("size", [64, 96, 128])
def test_output_shapes_follow_input_size(width: float, inner: int, size: int) -> None:
    model = DBNet(backbone_width=width, inner_channels=inner)
    images = torch.randn(2, 3, size, size + 32)

    train_out = model(images)
    assert set(train_out) == {"prob_logits", "thresh", "binary_logits", "prob"}
    for value in train_out.values():
        assert value.shape == (2, size, size + 32)
    assert float(train_out["thresh"].detach().min()) >= 0.0
    assert float(train_out["thresh"].detach().max()) <= 1.0

    model.eval()
    with torch.no_grad():
        eval_out = model(images)
    assert set(eval_out) == {"prob_logits", "prob"}
    assert eval_out["prob"].shape == (2, size, size + 32)
    with torch.no_grad():
        assert "thresh" in model(images, training_maps=True)


def test_backbone_feature_strides_and_channels() -> None:
    backbone = ResNetBackbone(width=0.5)
    features = backbone(torch.randn(1, 3, 128, 64))
    assert backbone.out_channels == (32, 64, 128, 256)
    assert [f.shape[1] for f in features] == list(backbone.out_channels)
    assert [tuple(f.shape[-2:]) for f in features] == [(32, 16), (16, 8), (8, 4), (4, 2)]


@pytest.mark.parametrize("shape", [(100, 64), (64, 80), (48, 48)])
def test_size_not_multiple_of_32_is_rejected(shape: tuple[int, int]) -> None:
    model = DBNet(backbone_width=0.25, inner_channels=64)
    with pytest.raises(ValueError, match="multiples of 32"):
        model(torch.randn(1, 3, *shape))


def test_initial_probability_is_the_prior() -> None:
    torch.manual_seed(0)
    model = DBNet(backbone_width=0.25, inner_channels=64, prob_prior=0.01)
    with torch.no_grad():
        prob = model(torch.randn(2, 3, 64, 64))["prob"]
    assert 0.005 < float(prob.mean()) < 0.02


def test_full_width_trunk_has_resnet18_parameter_count() -> None:
    assert _expected_trunk_params(1.0) == RESNET18_TRUNK_PARAMS == 11_176_512
    assert _param_count(ResNetBackbone(width=1.0)) == RESNET18_TRUNK_PARAMS
    assert _param_count(ResNetBackbone(width=0.5)) == _expected_trunk_params(0.5)


def test_key_names_follow_torchvision_resnet18() -> None:
    assert set(ResNetBackbone(width=1.0).state_dict()) == _torchvision_resnet18_trunk_keys()


def _randomised(backbone: ResNetBackbone, seed: int) -> ResNetBackbone:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in backbone.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator))
    return backbone


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state_b = b.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value, state_b[key]), key


def test_weights_round_trip_with_prefix_and_classifier(tmp_path) -> None:
    source = _randomised(ResNetBackbone(width=0.25), seed=1)
    state = {f"backbone.{k}": v for k, v in source.state_dict().items()}
    state["backbone.fc.weight"] = torch.zeros(1000, 128)
    state["fc.bias"] = torch.zeros(1000)
    path = tmp_path / "prefixed.pth"
    torch.save(state, path)

    target = ResNetBackbone(width=0.25)
    report = load_backbone_weights(target, path)
    _assert_same_state(source, target)
    assert report.loaded == len(source.state_dict())
    assert report.missing == [] and report.unexpected == []


def test_weights_from_checkpoint_dict_of_a_whole_detector(tmp_path) -> None:
    detector = DBNet(backbone_width=0.25, inner_channels=64)
    _randomised(detector.backbone, seed=2)
    state = {f"module.{k}": v for k, v in detector.state_dict().items()}
    path = tmp_path / "checkpoint.ckpt"
    torch.save({"state_dict": state, "epoch": 3}, path)

    fresh = DBNet(backbone_width=0.25, inner_channels=64, backbone_weights=str(path))
    _assert_same_state(detector.backbone, fresh.backbone)


def test_file_without_batch_counters_loads(tmp_path) -> None:
    source = _randomised(ResNetBackbone(width=0.25), seed=3)
    state = {k: v for k, v in source.state_dict().items() if "num_batches_tracked" not in k}
    path = tmp_path / "old_style.pth"
    torch.save(state, path)
    target = ResNetBackbone(width=0.25)
    load_backbone_weights(target, path)
    _assert_same_state(source, target)


def test_wrong_shapes_name_file_and_key_and_leave_backbone_untouched(tmp_path) -> None:
    path = tmp_path / "narrow.pth"
    torch.save(ResNetBackbone(width=0.25).state_dict(), path)
    target = ResNetBackbone(width=0.5)
    before = {k: v.clone() for k, v in target.state_dict().items()}

    with pytest.raises(BackboneWeightsError) as caught:
        load_backbone_weights(target, path, strict=False)
    message = str(caught.value)
    assert str(path) in message
    assert "conv1.weight" in message
    assert "(file (16, 3, 7, 7), backbone (32, 3, 7, 7))" in message
    for key, value in target.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_missing_and_unexpected_keys(tmp_path) -> None:
    state = ResNetBackbone(width=0.25).state_dict()
    del state["layer4.1.conv2.weight"]
    state["layer5.0.conv1.weight"] = torch.zeros(1)
    path = tmp_path / "partial.pth"
    torch.save(state, path)

    with pytest.raises(BackboneWeightsError, match=r"missing 1 keys: layer4\.1\.conv2\.weight"):
        load_backbone_weights(ResNetBackbone(width=0.25), path)
    with pytest.raises(BackboneWeightsError, match=r"unexpected 1 keys: layer5\.0\.conv1"):
        load_backbone_weights(ResNetBackbone(width=0.25), path)

    report = load_backbone_weights(ResNetBackbone(width=0.25), path, strict=False)
    assert report.missing == ["layer4.1.conv2.weight"]
    assert report.unexpected == ["layer5.0.conv1.weight"]


def test_missing_or_unreadable_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.pth"):
        load_backbone_weights(ResNetBackbone(width=0.25), tmp_path / "absent.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(BackboneWeightsError, match=r"garbage\.pth"):
        load_backbone_weights(ResNetBackbone(width=0.25), garbage)


def _rectangle_batch(size: int = 64) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Two images with a bright rectangle each, and DBNet-style targets for it."""
    images = torch.randn(2, 3, size, size) * 0.1
    shrink = torch.zeros(2, size, size)
    thresh_map = torch.full((2, size, size), 0.3)
    thresh_mask = torch.zeros(2, size, size)
    for index, (top, left) in enumerate([(16, 8), (30, 20)]):
        images[index, :, top : top + 16, left : left + 36] += 1.0
        shrink[index, top + 3 : top + 13, left + 3 : left + 33] = 1.0
        thresh_mask[index, top - 3 : top + 19, left - 3 : left + 39] = 1.0
        thresh_map[index, top - 3 : top + 19, left - 3 : left + 39] = 0.7
        thresh_map[index, top + 3 : top + 13, left + 3 : left + 33] = 0.3
    batch = {
        "shrink_map": shrink,
        "shrink_mask": torch.ones(2, size, size),
        "thresh_map": thresh_map,
        "thresh_mask": thresh_mask,
    }
    return images, batch


def test_tiny_model_overfits_a_rectangle() -> None:
    torch.manual_seed(0)
    model = DBNet(backbone_width=0.25, inner_channels=64)
    criterion = DBLoss()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    images, batch = _rectangle_batch()

    losses = []
    for _ in range(30):
        loss = criterion(model(images), batch)["loss"]
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))

    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses
