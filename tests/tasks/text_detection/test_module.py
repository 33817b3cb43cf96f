"""The DBNet LightningModule's own settings: the layout of the network's weights."""

from __future__ import annotations

import torch

from vramkit.tasks.text_detection.module import TextDetectionModule
from vramkit.tasks.text_detection.network.dbnet import DBNet
from vramkit.tasks.text_detection.network.loss import DBLoss


def _module(*, channels_last: bool, seed: int = 0) -> TextDetectionModule:
    torch.manual_seed(seed)
    return TextDetectionModule(
        DBNet(backbone_width=0.25, inner_channels=16),
        DBLoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        channels_last=channels_last,
    )


def _convolution_weights(module: TextDetectionModule) -> list[torch.Tensor]:
    return [parameter for parameter in module.parameters() if parameter.dim() == 4]


def test_channels_last_lays_every_convolution_weight_out_nhwc_with_the_same_values() -> None:
    nchw, nhwc = _module(channels_last=False), _module(channels_last=True)
    assert all(weight.is_contiguous() for weight in _convolution_weights(nchw))
    assert all(
        weight.is_contiguous(memory_format=torch.channels_last)
        for weight in _convolution_weights(nhwc)
    )
    # a weight of one channel or a 1x1 kernel is both layouts at once; the others are NHWC only
    assert sum(not weight.is_contiguous() for weight in _convolution_weights(nhwc)) > 20
    for name, value in nchw.state_dict().items():
        assert torch.equal(value, nhwc.state_dict()[name]), name


def test_a_state_dict_loads_across_layouts_and_the_layout_stays() -> None:
    # another seed: values the NHWC module does not already hold
    nchw, nhwc = _module(channels_last=False, seed=1), _module(channels_last=True)
    nhwc.load_state_dict(nchw.state_dict())
    assert all(
        weight.is_contiguous(memory_format=torch.channels_last)
        for weight in _convolution_weights(nhwc)
    )
    images = torch.randn(2, 3, 64, 64)
    nchw.eval(), nhwc.eval()
    with torch.no_grad():
        expected = nchw(images)["prob"]
        got = nhwc(images.contiguous(memory_format=torch.channels_last))["prob"]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
