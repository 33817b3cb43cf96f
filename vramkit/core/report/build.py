"""``build_report(run_dir)``: report.html and its PNGs from what a run folder holds.

Read: the CSV logger's ``metrics.csv`` (curves), ``memory_plan.json`` (the planner's prediction,
written when a GPU run planned its batch sizes), ``resolved_config.yaml`` (the run's heading) and
the task pictures already saved under ``report/`` (``task_*.png``, drawn at the end of the fit
from the trained model; a rebuild shows them again but cannot redraw them).
"""

from __future__ import annotations

import datetime
import html
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from vramkit.core.report.curves import Panel, plot_series
from vramkit.core.report.memory_plan_figure import plot_memory_plan
from vramkit.core.report.run_metrics import Series, find_metrics_csv, read_metrics
from vramkit.core.report.task_figures import saved_task_figures

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

REPORT_NAME = "report.html"
"""The report's file name in the run folder."""
REPORT_DIR = "report"
"""The folder beside it that holds its PNGs."""
MEMORY_PLAN = "memory_plan.json"
"""The planner's prediction for the run (``{"train": {"batch_size", "peak_gib",
"max_allocated_gib"}, "val": ..., "budget_gib", "profile"}``), written by the hardware
resolution when it planned (see `resolve_auto_batch_sizes`)."""


@dataclass
class Section:
    """One heading of the report: pictures (paths relative to the run folder) and notes."""

    title: str
    images: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)
    notes: list[str] = field(default_factory=list)


def build_report(run_dir: Path) -> Path:
    """Write ``<run_dir>/report.html`` and ``<run_dir>/report/*.png``; return the HTML's path.

    Sections with no data say what is missing instead of being left out, so a reader knows
    whether a picture was never made or could not be made.
    """
    run_dir = Path(run_dir)
    # no report/ folder made up front: each picture's writer makes it, so no picture, no folder
    csv_path = find_metrics_csv(run_dir)
    metrics = read_metrics(csv_path) if csv_path is not None else {}
    sections = [
        _summary_section(run_dir, metrics, csv_path),
        *_curve_sections(run_dir, metrics),
        _memory_section(run_dir, metrics),
        _task_section(run_dir),
    ]
    path = run_dir / REPORT_NAME
    partial = path.with_name(path.name + ".partial")
    partial.write_text(_page(run_dir, sections), encoding="utf-8")
    os.replace(partial, path)  # a reader never sees half a page
    return path


# (title, file stem, panels: (panel title, which metrics, y axis from 0)); each picture one PNG
# in report/. A panel is drawn only when a metric it names was logged, and draws only those.
_CURVES: list[tuple[str, str, list[tuple[str, Callable[[str], bool], bool]]]] = [
    (
        "Loss",
        "loss",
        [
            ("training loss", lambda n: n == "train/loss" or n == "train/loss_step", False),
            (
                "training loss terms",
                lambda n: n.startswith("train/loss_") and n != "train/loss_step",
                False,
            ),
            ("validation loss", lambda n: n.startswith("val/") and "loss" in n, False),
        ],
    ),
    (
        "Validation metrics",
        "val_metrics",
        [
            (
                "validation",
                lambda n: n.startswith("val/") and "loss" not in n and "/copy_" not in n,
                False,
            ),
            ("references", lambda n: n.startswith("val/") and "/copy_" in n, False),
            ("other training metrics", lambda n: n.startswith("train/") and "loss" not in n, False),
        ],
    ),
    ("Learning rate", "learning_rate", [("learning rate", lambda n: n.startswith("lr-"), True)]),
    (
        "Throughput and step time",
        "throughput",
        [
            ("training samples/s", lambda n: n == "perf/train_samples_per_s", True),
            ("validation samples/s", lambda n: n == "perf/val_samples_per_s", True),
            ("training step time (ms)", lambda n: n.startswith("perf/train_step_ms"), True),
            ("share of step time waiting for data", lambda n: n == "perf/data_wait_fraction", True),
            ("val/train time per sample", lambda n: n == "perf/val_train_time_ratio", True),
            ("MFU: share of the peak FLOP/s", lambda n: n == "perf/mfu", True),
        ],
    ),
]


def _curve_sections(run_dir: Path, metrics: dict[str, Series]) -> list[Section]:
    sections = []
    for title, stem, wanted in _CURVES:
        panels = []
        for panel_title, matches, from_zero in wanted:
            chosen = [metrics[name] for name in sorted(metrics) if matches(name)]
            panels.extend(_split_by_axis(Panel(panel_title, chosen, from_zero=from_zero)))
        sections.append(_curve_section(run_dir, title, stem, panels))
    sections.append(_memory_curves(run_dir, metrics))
    return sections


def _curve_section(run_dir: Path, title: str, stem: str, panels: list[Panel]) -> Section:
    section = Section(title)
    if panels:
        relative = f"{REPORT_DIR}/{stem}.png"
        plot_series(run_dir / relative, panels)
        names = sorted({s.name for panel in panels for s in panel.series})
        section.images.append((relative, ", ".join(names)))
    else:
        section.notes.append("nothing logged for this section in metrics.csv")
    return section


def _memory_curves(run_dir: Path, metrics: dict[str, Series]) -> Section:
    """mem/<phase>_<reading>_gib over the epochs, each reading in its own panel titled by what
    it is on this run's device, axes from 0, the planner's peaks beside the measured ones."""
    on_cpu = _on_cpu(run_dir)
    readings = [
        ("peak", "peak resident set, main process (GiB)" if on_cpu else "peak allocated (GiB)"),
        ("rss", "resident set at phase end, main process (GiB)"),
        ("allocated", "allocated at phase end (GiB)"),
        ("reserved", "peak reserved by the caching allocator (GiB)"),
    ]
    planned = {f"mem/{phase}_peak_gib": value for phase, value in _planned_peaks(run_dir).items()}
    panels = []
    for reading, panel_title in readings:
        chosen = [
            metrics[name]
            for name in sorted(metrics)
            if name.startswith("mem/") and name.endswith(f"_{reading}_gib")
        ]
        panel = Panel(panel_title, chosen, from_zero=True, planned=planned)
        panels.extend(_split_by_axis(panel))
    return _curve_section(run_dir, "Memory per phase over time", "memory", panels)


def _split_by_axis(panel: Panel) -> list[Panel]:
    """Per-epoch and per-step series of one panel drawn apart: they share no x axis."""
    per_epoch = [s for s in panel.series if s.per_epoch]
    per_step = [s for s in panel.series if not s.per_epoch]
    if per_epoch and per_step:
        return [
            replace(panel, title=f"{panel.title} (per step)", series=per_step),
            replace(panel, title=f"{panel.title} (per epoch)", series=per_epoch),
        ]
    return [panel] if panel.series else []


def _on_cpu(run_dir: Path) -> bool:
    config = _read_yaml(run_dir / "resolved_config.yaml")
    return (config.get("hw") or {}).get("accelerator") == "cpu"


def _planned_peaks(run_dir: Path) -> dict[str, float]:
    """The planner's prediction of what mem/<phase>_peak_gib reads, per phase (GiB): on a GPU
    the allocator's peak (max_allocated_gib, not the peak with the CUDA context the budget
    counts), on a CPU the main process's resident set (peak_gib)."""
    plan = _read_json(run_dir / MEMORY_PLAN)
    return {
        phase: float(plan[phase].get("max_allocated_gib", plan[phase]["peak_gib"]))
        for phase in ("train", "val")
        if isinstance(plan.get(phase), dict) and "peak_gib" in plan[phase]
    }


def _budget_peaks(plan: dict) -> dict[str, float]:
    """The plan's peak of each phase as the budget counts it and the run's log prints it (GiB):
    on a GPU with the CUDA context and the allocator's reserve, on a CPU the resident set."""
    return {
        phase: float(plan[phase]["peak_gib"])
        for phase in ("train", "val")
        if isinstance(plan.get(phase), dict) and "peak_gib" in plan[phase]
    }


def _summary_section(run_dir: Path, metrics: dict[str, Series], csv_path: Path | None) -> Section:
    section = Section("Run")
    config = _read_yaml(run_dir / "resolved_config.yaml")
    hw = config.get("hw") or {}
    facts = [
        ("run folder", str(run_dir)),
        ("task", config.get("task_name")),
        ("hardware profile", hw.get("name") if isinstance(hw, dict) else None),
        ("precision", hw.get("precision") if isinstance(hw, dict) else None),
        ("metrics", str(csv_path.relative_to(run_dir)) if csv_path else "no metrics.csv found"),
    ]
    section.notes.extend(f"{key}: {value}" for key, value in facts if value is not None)
    best_name = config.get("optimized_metric")
    mode = config.get("monitor_mode", "max")
    for name in sorted(metrics):
        if not (name.startswith("val/") or name.startswith("test/")):
            continue
        values = metrics[name].values
        best = max(values) if (mode == "max") != ("loss" in name) else min(values)
        star = " (optimized)" if name == best_name else ""
        section.notes.append(f"{name}{star}: last {values[-1]:.4g}, best {best:.4g}")
    return section


def _memory_section(run_dir: Path, metrics: dict[str, Series]) -> Section:
    section = Section("Planned and measured peak memory")
    measured: dict[str, float] = {}
    unit = "peak"
    for name, series in metrics.items():
        parts = name.removeprefix("mem/").split("_")
        if name.startswith("mem/") and name.endswith("_peak_gib") and len(parts) == 3:
            measured[parts[0]] = max(series.values)
    if _on_cpu(run_dir):
        unit = "peak (host RSS, main process)"
    plan = _read_json(run_dir / MEMORY_PLAN)
    predicted = _planned_peaks(run_dir)
    if not measured and not predicted:
        section.notes.append("no mem/<phase>_peak_gib metric and no memory_plan.json")
        return section
    relative = f"{REPORT_DIR}/memory_plan.png"
    budget_peaks = _budget_peaks(plan)
    on_gpu = any(budget_peaks.get(phase) != predicted[phase] for phase in predicted)
    plot_memory_plan(
        run_dir / relative,
        measured,
        predicted,
        plan.get("budget_gib"),
        unit_label=unit,
        predicted_label="planner's prediction" + (" (max allocated)" if on_gpu else ""),
    )
    section.images.append((relative, "peak memory per phase"))
    for phase in sorted(set(measured) & set(predicted)):
        error = predicted[phase] / measured[phase] - 1 if measured[phase] else float("nan")
        section.notes.append(
            f"{phase}: predicted {predicted[phase]:.3f} GiB, measured {measured[phase]:.3f} GiB "
            f"({error:+.1%})"
        )
    for phase in sorted(predicted):
        # The run's log prints the plan's peak with the CUDA context and the allocator's reserve
        # (what the budget counts); the bars compare what max_memory_allocated reads.
        if budget_peaks.get(phase, predicted[phase]) != predicted[phase]:
            section.notes.append(
                f"{phase}: planned peak {budget_peaks[phase]:.2f} GiB, the number the run log "
                f"prints and the budget counts (max allocated {predicted[phase]:.3f} GiB plus "
                "the CUDA context and the allocator reserve)"
            )
    if not predicted:
        section.notes.append(
            "no planner prediction: the run planned nothing (a CPU run, or batch sizes set by "
            "hand); `python scripts/plan_memory.py` predicts one"
        )
    return section


def _task_section(run_dir: Path) -> Section:
    section = Section("Task pictures")
    for png, title, caption in saved_task_figures(run_dir / REPORT_DIR):
        text = title + (f": {caption}" if caption else "")
        section.images.append((png.relative_to(run_dir).as_posix(), text))
    if not section.images:
        section.notes.append(
            "none: the task's LightningModule has no report_figures(trainer, samples), or the "
            "run ended before they were drawn"
        )
    return section


def _page(run_dir: Path, sections: list[Section]) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = []
    for section in sections:
        body.append(f"<section><h2>{html.escape(section.title)}</h2>")
        if section.notes:
            items = "".join(f"<li>{html.escape(note)}</li>" for note in section.notes)
            body.append(f"<ul>{items}</ul>")
        for relative, caption in section.images:
            src = html.escape(relative, quote=True)
            alt = html.escape(caption, quote=True)
            body.append(
                f'<figure><a href="{src}"><img src="{src}" alt="{alt}">'
                f"</a><figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        body.append("</section>")
    return _TEMPLATE.format(
        title=html.escape(f"vramkit run report: {run_dir.name}"),
        stamp=stamp,
        body="\n".join(body),
    )


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
h2 {{ border-bottom: 1px solid #ccc; padding-bottom: .2em; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
figcaption {{ font-size: .85em; color: #555; }}
</style></head>
<body><h1>{title}</h1><p>built {stamp} by vramkit (python -m vramkit.report RUN_DIR rebuilds it)</p>
{body}
</body></html>
"""


def _read_yaml(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        # LibYAML's safe loader (PyYAML documentation, "LibYAML bindings"): what yaml.safe_load
        # returns, for 2.5 ms of CPU instead of 18 ms on a run's 7 kB resolved config (measured
        # median of 7); a report reads it three times
        loaded = yaml.load(path.read_text(), Loader=_SAFE_LOADER)
    except yaml.YAMLError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}
