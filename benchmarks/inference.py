"""CPU inference speed of DBNet: PyTorch eager fp32 against onnxruntime fp32 and int8.

For each network config (``dbnet_tiny``, the default job's quarter-width model, and
``dbnet_r18``, the paper's DBNet-R18) the network is built from ``conf/model/<name>.yaml``,
exported with ``scripts/export.py``'s code (dynamo exporter, opset 18) and quantised to int8
(static QDQ, per-channel weights, calibrated on random normalised images, and dynamic). Speed
does not depend on the weights' values, so fresh weights are timed; ``export.json`` of a real
export records the accuracy side.

PyTorch is timed twice: in NCHW, the reference of every speedup, and in NHWC (channels last),
the layout every profile gives DBNet (``hw.channels_last``) and so what ``eval.py`` runs.

Batch 1 at 640x640 and at the ICDAR 2015 size 1280x736 (height x width 736x1280). PyTorch and
onnxruntime get the same number of intra-op threads; each count of ``--threads`` (default 1 and
the usable cores) is timed. On a loaded machine, read the 1-thread numbers: PyTorch's OpenMP
threads spin at their barriers, and with more runnable threads than cores it slowed 5x at 2
threads (1.5 s vs 8.2 s for dbnet_tiny at 640x640, load 14 on 2 cores), which flatters any rival.
The backends take turns, one inference each per round, in an order that rotates every round, so
load that drifts on a shared machine hits all alike; latency median and p90 over the rounds,
images/s = 1 / median, and the headline: each backend's speedup over PyTorch (median / median).

``python -m benchmarks.inference [--rounds N] [--models dbnet_tiny dbnet_r18] [--threads T]``
writes ``results/inference.json``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.configs import quiet_libraries
from benchmarks.record import usable_cores, write_result
from vramkit.core.config.instantiate import instantiate
from vramkit.core.run.settling.compose import compose_config
from vramkit.tasks.text_detection.export.onnx_export import INPUT_NAME, export_dbnet
from vramkit.tasks.text_detection.export.onnx_inference import make_session
from vramkit.tasks.text_detection.export.onnx_quantize import (
    quantize_dynamic_int8,
    quantize_static_qdq,
)

SIZES = {"640x640": (640, 640), "1280x736": (736, 1280)}  # name → (height, width) px
MODELS = ("dbnet_tiny", "dbnet_r18")
CALIBRATION_BATCHES = 8
TARGET_SPEEDUP = 3.3  # what the project's brief hoped for from ONNX + int8 on CPU
REFERENCE = "pytorch_eager_fp32"  # every speedup is over this: eager PyTorch, NCHW
CHANNELS_LAST = "pytorch_eager_fp32_channels_last"  # eager PyTorch in NHWC (hw.channels_last)


def _network(model: str) -> torch.nn.Module:
    cfg = compose_config("train", ["+hw=cpu", f"model={model}"])
    return instantiate(cfg.model.net).eval()


def _onnx_models(net: torch.nn.Module, folder: Path) -> dict[str, Path]:
    fp32 = folder / "dbnet.onnx"
    export_dbnet(net, fp32, sample_size=(640, 640))
    generator = np.random.default_rng(0)
    calibration = (
        generator.standard_normal((1, 3, 640, 640), dtype=np.float32)
        for _ in range(CALIBRATION_BATCHES)
    )
    static = quantize_static_qdq(fp32, folder / "int8_static.onnx", calibration)["path"]
    dynamic = quantize_dynamic_int8(fp32, folder / "int8_dynamic.onnx")["path"]
    return {
        "onnxruntime_fp32": fp32,
        "onnxruntime_int8_static": static,
        "onnxruntime_int8_dynamic": dynamic,
    }


def _runners(
    net: torch.nn.Module, models: dict[str, Path], threads: int
) -> dict[str, Callable[[np.ndarray], Any]]:
    def run_torch(images: np.ndarray) -> Any:
        with torch.inference_mode():
            return net(torch.from_numpy(images))["prob"]

    nhwc = copy.deepcopy(net).to(memory_format=torch.channels_last)

    def run_torch_channels_last(images: np.ndarray) -> Any:
        # eval.py's own layout under a profile's channels_last (the image's NHWC copy included)
        with torch.inference_mode():
            return nhwc(torch.from_numpy(images).contiguous(memory_format=torch.channels_last))[
                "prob"
            ]

    runners: dict[str, Callable[[np.ndarray], Any]] = {
        REFERENCE: run_torch,
        CHANNELS_LAST: run_torch_channels_last,
    }
    for name, path in models.items():
        session = make_session(path, threads=threads)
        runners[name] = lambda images, session=session: session.run(None, {INPUT_NAME: images})
    return runners


def _time_backends(
    runners: dict[str, Callable[[np.ndarray], Any]], images: np.ndarray, rounds: int, warmup: int
) -> dict[str, list[float]]:
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name](images)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            runners[name](images)
            latencies[name].append(time.perf_counter() - started)
    return latencies


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(np.ceil(0.9 * len(ordered))) - 1)]
    median = statistics.median(ordered)
    return {
        "latency_ms_median": round(median * 1e3, 2),
        "latency_ms_p90": round(p90 * 1e3, 2),
        "images_per_s": round(1.0 / median, 3),
        "runs": len(ordered),
    }


def benchmark_model(
    model: str, thread_counts: Sequence[int], rounds: int, warmup: int
) -> dict[str, Any]:
    """Timings of every backend of ``model`` at every size and thread count, with speedups."""
    net = _network(model)
    parameters = sum(p.numel() for p in net.parameters())
    by_threads: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        models = _onnx_models(net, Path(folder))
        for threads in thread_counts:
            torch.set_num_threads(threads)
            runners = _runners(net, models, threads)
            sizes = {}
            for size_name, (height, width) in SIZES.items():
                images = np.random.default_rng(1).standard_normal(
                    (1, 3, height, width), dtype=np.float32
                )
                latencies = _time_backends(runners, images, rounds, warmup)
                results = {name: _summary(values) for name, values in latencies.items()}
                reference = results[REFERENCE]["latency_ms_median"]
                for entry in results.values():
                    entry["speedup_over_pytorch"] = round(reference / entry["latency_ms_median"], 2)
                sizes[size_name] = results
                print(
                    f"{model} {size_name} {threads} thread(s): "
                    + ", ".join(
                        f"{name} {entry['latency_ms_median']} ms ({entry['speedup_over_pytorch']}x)"
                        for name, entry in results.items()
                    ),
                    flush=True,
                )
            by_threads[str(threads)] = sizes
    return {"parameters": parameters, "threads": by_threads}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inference", description=__doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=sorted({1, usable_cores()}),
        help="intra-op thread counts, each timed (default: 1 and the usable cores)",
    )
    parser.add_argument("--rounds", type=int, default=15, help="timed inferences per backend")
    parser.add_argument("--warmup", type=int, default=2, help="untimed inferences per backend")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    quiet_libraries()
    warnings.filterwarnings("ignore")
    models = {
        model: benchmark_model(model, args.threads, args.rounds, args.warmup)
        for model in args.models
    }
    headline = {
        f"{model} {size} {threads}t": {
            name: entry["speedup_over_pytorch"]
            for name, entry in results["threads"][threads][size].items()
            if name not in (REFERENCE, CHANNELS_LAST)
        }
        for model, results in models.items()
        for threads in results["threads"]
        for size in SIZES
    }
    # The headline is single-threaded where it was measured (see the module docstring).
    fair = {case: speeds for case, speeds in headline.items() if case.endswith(" 1t")} or headline
    best = max(speed for entry in fair.values() for speed in entry.values())
    write_result(
        "inference",
        {
            "thread_counts": args.threads,
            "batch": 1,
            "exporter": "torch.onnx.export(dynamo=True), opset 18",
            "onnxruntime": __import__("onnxruntime").__version__,
            "speedup_over_pytorch": headline,
            "best_speedup": best,
            "target_speedup": TARGET_SPEEDUP,
            "models": models,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
