"""ONNX export of DBNet: checker, dynamic batch/height/width, parity with PyTorch, int8 models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from vramkit.tasks.text_detection.export.onnx_export import export_dbnet
from vramkit.tasks.text_detection.export.onnx_inference import OnnxDBNet
from vramkit.tasks.text_detection.export.onnx_quantize import (
    node_names,
    nodes_of_modules,
    quantize_dynamic_int8,
    quantize_static_qdq,
)
from vramkit.tasks.text_detection.network.dbnet import DBNet

# Sizes the export never saw: another batch, height != width, both different from the sample.
OTHER_SHAPES = [(2, 3, 96, 160), (1, 3, 64, 64)]
# onnxruntime and PyTorch sum convolutions in different orders; with the large logits of
# tiny_dbnet's head, float32 maps then differ by ~1e-4 in probability.
FP32_TOLERANCE = 5e-4


def tiny_dbnet(seed: int = 0) -> DBNet:
    """An eighth-width DBNet with spread-out output weights, so its maps are not constant."""
    torch.manual_seed(seed)
    net = DBNet(backbone_width=0.125, inner_channels=16)
    torch.nn.init.normal_(net.head.prob[-1].weight, std=1.0)
    return net.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[DBNet, Path]:
    """A tiny DBNet and its export (TorchScript exporter: seconds, where dynamo takes ~15 s)."""
    net = tiny_dbnet()
    path = tmp_path_factory.mktemp("onnx") / "dbnet.onnx"
    export_dbnet(net, path, sample_size=(64, 96), exporter="torchscript")
    return net, path


def _max_diff(net: DBNet, onnx_net: OnnxDBNet, shape: tuple[int, ...]) -> float:
    images = torch.randn(*shape)
    with torch.no_grad():
        expected = net(images)["prob"]
    got = onnx_net(images)["prob"]
    assert got.shape == expected.shape == (shape[0], shape[2], shape[3])
    return float((got - expected).abs().max())


@pytest.mark.slow
def test_dynamo_export_passes_the_checker_with_symbolic_sizes_and_matches_torch(tmp_path):
    net = tiny_dbnet()
    record = export_dbnet(net, tmp_path / "dbnet.onnx", sample_size=(64, 96))
    assert record["opset"] == 18
    assert record["input"]["shape"][0] == "batch" and record["input"]["shape"][1] == 3
    assert all(isinstance(dim, str) for dim in record["input"]["shape"][2:])
    onnx.checker.check_model(onnx.load(str(tmp_path / "dbnet.onnx")), full_check=True)
    onnx_net = OnnxDBNet(tmp_path / "dbnet.onnx", threads=1)
    for shape in OTHER_SHAPES:
        assert _max_diff(net, onnx_net, shape) < FP32_TOLERANCE
    assert not net.training  # export leaves the network's mode as it was
    # Modules are found by the scopes the dynamo exporter records: the head's output layer.
    (output_layer,) = nodes_of_modules(tmp_path / "dbnet.onnx", ["net.head.prob.6"])
    assert output_layer in node_names(tmp_path / "dbnet.onnx", ("ConvTranspose",))
    assert len(nodes_of_modules(tmp_path / "dbnet.onnx", ["net.head.prob"])) > 3
    with pytest.raises(ValueError, match=r"net\.haed"):
        nodes_of_modules(tmp_path / "dbnet.onnx", ["net.haed"])


@pytest.mark.slow
def test_a_channels_last_network_exports_in_nchw_and_keeps_its_own_layout(tmp_path):
    # torch.export fails on NHWC weights with symbolic height and width (torch 2.13): the
    # export works on an NCHW copy, and the network the caller trains goes on in NHWC.
    net = tiny_dbnet().to(memory_format=torch.channels_last).train()
    export_dbnet(net, tmp_path / "dbnet.onnx", sample_size=(64, 96))
    assert net.training  # the caller's mode is left as it was too
    onnx_net = OnnxDBNet(tmp_path / "dbnet.onnx", threads=1)
    net.eval()
    for shape in OTHER_SHAPES:
        assert _max_diff(net, onnx_net, shape) < FP32_TOLERANCE
    convolutions = [p for p in net.parameters() if p.dim() == 4]
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convolutions)


def test_torchscript_export_runs_at_other_batches_and_sizes(exported):
    net, path = exported
    onnx_net = OnnxDBNet(path, threads=1)
    for shape in OTHER_SHAPES:
        assert _max_diff(net, onnx_net, shape) < FP32_TOLERANCE


def test_export_refuses_a_sample_size_off_the_32_px_grid(tmp_path):
    with pytest.raises(ValueError, match="multiples of 32"):
        export_dbnet(tiny_dbnet(), tmp_path / "x.onnx", sample_size=(64, 100))


def test_the_exported_network_has_no_training_maps(exported):
    _, path = exported
    with pytest.raises(ValueError, match="only the probability map"):
        OnnxDBNet(path, threads=1)(torch.zeros(1, 3, 64, 64), training_maps=True)


def _calibration(count: int = 3) -> list[np.ndarray]:
    generator = np.random.default_rng(0)
    return [generator.standard_normal((2, 3, 64, 64), dtype=np.float32) for _ in range(count)]


def test_static_int8_model_is_qdq_per_channel_and_close_to_fp32(exported, tmp_path):
    net, path = exported
    record = quantize_static_qdq(path, tmp_path / "int8.onnx", _calibration())
    graph = onnx.load(record["path"]).graph
    ops = {node.op_type for node in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    weight_dequantizers = [
        node
        for node in graph.node
        if node.op_type == "DequantizeLinear"
        and node.input[0] in initializers
        and initializers[node.input[0]].data_type == onnx.TensorProto.INT8
    ]
    assert len(weight_dequantizers) == len(node_names(record["path"], ("Conv", "ConvTranspose")))
    for node in weight_dequantizers:
        # Per channel: one scale for every output channel along the node's axis.
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        weight, scale = initializers[node.input[0]], initializers[node.input[1]]
        assert list(scale.dims) == [weight.dims[axis]], node.name
    assert record["bytes"] < path.stat().st_size
    onnx_net = OnnxDBNet(record["path"], threads=1)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = net(images)["prob"]
    got = onnx_net(images)["prob"]
    assert got.shape == expected.shape
    difference = (got - expected).abs()
    # Quantised (not bit-equal), yet the same map: a random network's saturated logits flip a
    # few pixels near 0.5, so the mean, not the max, is what shows it.
    assert 0.0 < float(difference.mean()) < 0.05


def test_nodes_named_fp32_stay_in_float(exported, tmp_path):
    _, path = exported
    first = quantize_static_qdq(path, tmp_path / "all.onnx", _calibration(1))
    convs = [name for name in node_names(first["path"], ("Conv",))]
    last_conv = convs[-1]
    kept = quantize_static_qdq(
        path, tmp_path / "kept.onnx", _calibration(1), fp32_nodes=[last_conv]
    )
    graph = onnx.load(kept["path"]).graph
    producers = {output: node for node in graph.node for output in node.output}
    (conv,) = [node for node in graph.node if node.name == last_conv]
    weight_producer = producers.get(conv.input[1])
    assert weight_producer is None or weight_producer.op_type != "DequantizeLinear"
    assert kept["fp32_nodes"] == [last_conv]


def test_dynamic_int8_model_runs_at_any_size(exported, tmp_path):
    _, path = exported
    record = quantize_dynamic_int8(path, tmp_path / "dynamic.onnx")
    onnx_net = OnnxDBNet(record["path"], threads=1)
    for shape in OTHER_SHAPES:
        images = torch.randn(*shape)
        prob = onnx_net(images)["prob"]
        assert prob.shape == (shape[0], shape[2], shape[3])
        assert float(prob.min()) >= 0.0 and float(prob.max()) <= 1.0
