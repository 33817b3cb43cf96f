"""The route of one run: ``python train.py <overrides>`` from ``train.py`` to ``trainer.fit``,
through the run's own files, as a newcomer reading the code follows it.

    python scripts/run_route.py +hw=cpu          # the default run on this machine
    python scripts/run_route.py +hw=t4 --fake-t4 # a T4 run's planning path, on a CPU
                                                 # (up to building the Trainer)
    python scripts/run_route.py +hw=cpu --json   # the counts as one JSON object

runs ``train.py`` in this process under a profile hook (`sys.setprofile`), stops it where
``Trainer.fit`` is called (nothing is trained), and prints the route file by file, the files it
enters, the re-entries not caused by a return, and how many times the config was composed.

What counts (the rule the counts follow):

- **The run's own files**: ``train.py`` and ``vramkit/``. Everything under ``vramkit/core/planner``
  is one entry, "the planner's inside": its files and whatever it calls are folded into it, but
  for `PLANNER_INPUT`, the planner's input types (``PlanRequest``, ``BatchSizeRequest``, the
  task's stated sizes and the run's setup built from plain values): building the request is
  done outside the planner, which is then entered once, with it.
- **Calls the reader follows**: a call from the run's own code, directly or through Python's
  context managers and decorators (``contextlib``, ``functools``, Lightning's ``rank_zero_only``),
  or from Hydra's app to the task function and to the Hydra callbacks of ``conf/hydra`` (which
  Hydra runs by design around the task). Our code reached through any other library is that
  library's work with our objects, read by its name at the call: Hydra's ``instantiate`` building a
  callback, model or datamodule (the constructors), an OmegaConf resolver when a value is read,
  Lightning calling a hook, torch running a module, a logging handler. Imports (module bodies)
  are not on the route either.
- **Utility calls are left out**, and what they call: a constructor (``__init__``,
  ``__post_init__``), and any call into `UTILITIES` (the config kit: settings dataclasses, schema
  classes, the checks of a node against them, the instantiation helper; the context managers that
  turn a refusal into its message; the profile's dataclass and its table of facts; the planner's
  input types; callbacks,
  models and data answering about themselves; the accessors of other libraries' private names).
  The reader takes such a call by its name and return value: it builds, checks or describes one
  thing and decides nothing about where the run goes next. They are listed apart, not counted.
- **Leaf calls are left out**: a call into a file that returns without entering another route
  file does its one job where the reader finds it; listed apart, not counted.
- **A re-entry** is a second visit to a route file that is not a return to it: the reader
  leaves the file and must come back to it later from elsewhere.

A composition is one call of Hydra's ``ConfigLoaderImpl.load_configuration``, which both
``@hydra.main`` and ``hydra.compose`` go through (``hydra/_internal/config_loader_impl.py``).
Hydra 1.3's ``_run_hydra`` composes once more before the run only to read ``hydra.mode``
(``Hydra.get_mode`` in ``hydra/_internal/hydra.py``, its result dropped): that probe is Hydra's
own, every ``@hydra.main`` app has it, and it is reported apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import runpy
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLANNER = "vramkit/core/planner"
"""Folded into one route entry: the planner's inside counted as one."""

PLANNER_INPUT = "vramkit/core/planner/request.py"
"""The planner's input types and their constructors: a utility file of their own, not its inside."""

PASS_THROUGH = ("/contextlib.py", "/functools.py", "/lightning_utilities/core/rank_zero.py")
"""Library files a call passes through to reach our code as the reader follows it."""

HYDRA_RUNNERS = ("/hydra/core/utils.py", "/hydra/_internal/callbacks.py")
"""Hydra's frames that call the task function (``run_job``) and the Hydra callbacks."""

UTILITIES = (
    PLANNER_INPUT,
    "vramkit/core/config/",
    "vramkit/core/run/refusal/",
    "vramkit/core/hardware/profile.py",
    "vramkit/core/callbacks/",
    "vramkit/core/compat/",
    "vramkit/tasks/",
)
"""Files whose calls are utility calls (see the module's docstring): not on the route."""

CONSTRUCTORS = ("__init__", "__post_init__", "__new__")

COMPOSITION = ("/hydra/_internal/config_loader_impl.py", "load_configuration")
"""The function every composition goes through."""


@dataclasses.dataclass
class Visit:
    """One stay in a route file: entered by a call, left by its return."""

    file: str
    function: str
    children: list[Visit] = dataclasses.field(default_factory=list)
    utility: bool = False
    """A utility call (`UTILITIES`, a constructor): its inside is not followed."""

    @property
    def leaf(self) -> bool:
        """A utility call, or one that entered no other route file before returning (the
        planner, whose inside is folded into it, is no leaf: it is the route's one entry)."""
        if self.file == PLANNER:
            return False
        return self.utility or not any(not child.utility for child in self.children)


@dataclasses.dataclass(frozen=True)
class Route:
    """What one run's route is made of (`trace_route`)."""

    root: Visit
    compositions: int
    """Compositions of the run's config (Hydra's mode probe not included)."""
    mode_probes: int
    """Hydra's own compositions that only read ``hydra.mode`` (``Hydra.get_mode``)."""
    reached_fit: bool

    def steps(self) -> list[tuple[int, Visit]]:
        """The route's visits in call order, with their depth; leaf calls left out."""
        found: list[tuple[int, Visit]] = []

        def walk(visit: Visit, depth: int) -> None:
            found.append((depth, visit))
            for child in visit.children:
                if not child.leaf:
                    walk(child, depth + 1)

        walk(self.root, 0)
        return found

    def files(self) -> list[str]:
        """The route's files, in the order first entered."""
        return list(dict.fromkeys(visit.file for _, visit in self.steps()))

    def reentries(self) -> list[str]:
        """Each visit to a route file entered before (not a return to it), as ``file:function``."""
        seen: set[str] = set()
        again = []
        for _, visit in self.steps():
            if visit.file in seen:
                again.append(f"{visit.file}:{visit.function}")
            seen.add(visit.file)
        return again

    def left_out(self, *, utility: bool) -> list[str]:
        """Files entered only by utility calls (`utility`), or else only by leaf calls, and so
        left out of the route, sorted."""
        entered: dict[str, bool] = {}

        def walk(visit: Visit) -> None:
            entered[visit.file] = entered.get(visit.file, True) and visit.utility
            for child in visit.children:
                walk(child)

        walk(self.root)
        route = set(self.files())
        return sorted(f for f, only in entered.items() if f not in route and only == utility)


class ReachedFit(BaseException):
    """Raised where ``Trainer.fit`` is called (with ``--fake-t4``: where the Trainer is built):
    the route ends there (a BaseException, so no refusal handler or Hydra's report takes it)."""


_ROUTE, _PASS, _OFF = "route", "pass", "off"


class _Recorder:
    """The profile hook: a stack of the frames' states beside the interpreter's."""

    def __init__(self, script: Path) -> None:
        self.script = str(script)
        self.root: Visit | None = None
        self.stack: list[tuple[str, Visit | None, bool]] = []  # state, visit, opened it
        self.compositions = 0
        self.mode_probes = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.stack.append(self._enter(frame))
        elif event == "return" and self.stack:
            self.stack.pop()

    def _enter(self, frame: FrameType) -> tuple[str, Visit | None, bool]:
        code = frame.f_code
        path = code.co_filename
        if code.co_name == COMPOSITION[1] and path.endswith(COMPOSITION[0]):
            if _probes_the_mode(frame):
                self.mode_probes += 1
            else:
                self.compositions += 1
        parent_state, current, _ = self.stack[-1] if self.stack else (_OFF, None, False)
        if self.root is None:
            if path == self.script and code.co_name == "<module>":
                self.root = Visit("train.py", "<module>")
                return _ROUTE, self.root, True
            return _OFF, None, False
        own = _own_file(path)
        if parent_state == _OFF and not (own is not None and _called_by_hydra(frame)):
            return _OFF, current, False
        if own is None:
            return (_PASS if path.endswith(PASS_THROUGH + HYDRA_RUNNERS) else _OFF), current, False
        if code.co_name == "<module>" or (current is not None and current.file == PLANNER):
            return _OFF, current, False  # an import; the planner's inside
        if current is not None and own == current.file:
            return _ROUTE, current, False
        utility = own.startswith(UTILITIES) or code.co_name in CONSTRUCTORS
        visit = Visit(own, code.co_qualname, utility=utility)
        if current is not None:
            current.children.append(visit)
        return (_OFF if utility else _ROUTE), visit, True


def _probes_the_mode(frame: FrameType) -> bool:
    caller = frame.f_back
    while caller is not None:
        if caller.f_code.co_name == "get_mode" and "/hydra/" in caller.f_code.co_filename:
            return True
        caller = caller.f_back
    return False


def _called_by_hydra(frame: FrameType) -> bool:
    # Hydra's run_job calls the task function, its Callbacks the Hydra callbacks.
    caller = frame.f_back
    return caller is not None and caller.f_code.co_filename.endswith(HYDRA_RUNNERS)


@functools.cache
def _own_file(path: str) -> str | None:
    try:
        relative = Path(path).resolve().relative_to(REPO)
    except ValueError:
        return None
    name = relative.as_posix()
    if name.startswith(PLANNER) and name != PLANNER_INPUT:
        return PLANNER
    return name if name.startswith("vramkit/") or name == "train.py" else None


@contextmanager
def _stopped(*, at_trainer: bool) -> Iterator[None]:
    """``Trainer.fit`` raises `ReachedFit`; so does building the Trainer when `at_trainer` (a
    faked GPU: Lightning's CUDA accelerator needs a CUDA build of torch)."""
    import lightning.pytorch as pl

    def stop(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ReachedFit

    saved = pl.Trainer.fit, pl.Trainer.__init__
    pl.Trainer.fit = stop
    if at_trainer:
        pl.Trainer.__init__ = stop
    try:
        yield
    finally:
        pl.Trainer.fit, pl.Trainer.__init__ = saved


@contextmanager
def _faked_t4() -> Iterator[None]:
    """vramkit's device probe answers as a Colab T4 (the settling tests' ``T4``): a T4 run's
    settling and planning path, on a CPU."""
    from vramkit.core.hardware.detect import DeviceInfo
    from vramkit.core.run.settling import settle

    t4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
    saved = settle.probe_device
    settle.probe_device = lambda *args, **kwargs: t4
    try:
        yield
    finally:
        settle.probe_device = saved


def trace_route(overrides: Sequence[str], *, fake_t4: bool = False) -> Route:
    """Run ``python train.py <overrides>`` in this process up to ``Trainer.fit`` and return its
    route. The run's folder goes to a temporary ``paths.log_dir`` unless the overrides say."""
    script = REPO / "train.py"
    # What train.py imports, imported before the hook: imports are not on the route, and the
    # hook would slow them many times over.
    importlib.import_module("vramkit.core.run.train")
    with tempfile.TemporaryDirectory() as logs, _stopped(at_trainer=fake_t4):
        argv = [str(script), *overrides]
        if not any(item.startswith("paths.log_dir=") for item in overrides):
            argv.append(f"paths.log_dir={logs}")
        recorder = _Recorder(script)
        saved_argv = sys.argv
        sys.argv = argv
        reached = False
        try:
            with _faked_t4() if fake_t4 else _nothing():
                sys.setprofile(recorder)
                try:
                    runpy.run_path(str(script), run_name="__main__")
                finally:
                    sys.setprofile(None)
        except ReachedFit:
            reached = True
        finally:
            sys.argv = saved_argv
    assert recorder.root is not None, "train.py never ran"
    return Route(recorder.root, recorder.compositions, recorder.mode_probes, reached)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def route_lines(route: Route) -> list[str]:
    """The route as printed: one line a visit, indented by call depth, then the counts."""
    lines = [f"{'  ' * depth}{visit.file}  ({visit.function})" for depth, visit in route.steps()]
    files, again = route.files(), route.reentries()
    lines += [
        "",
        f"files on the route: {len(files)}",
        *(f"  {n}. {name}" for n, name in enumerate(files, 1)),
        f"re-entries (not a return): {len(again)}",
        *(f"  {name}" for name in again),
        *_listed("files entered by utility calls only", route.left_out(utility=True)),
        *_listed("files entered by leaf calls only", route.left_out(utility=False)),
        f"compositions: {route.compositions} (and Hydra's mode probe: {route.mode_probes})",
        f"reached Trainer.fit: {route.reached_fit}",
    ]
    return lines


def _listed(title: str, names: list[str]) -> list[str]:
    return [f"{title} (not counted): {len(names)}", *(f"  {name}" for name in names)]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the route of ``python train.py <overrides>``; 1 when it did not reach the fit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake-t4", action="store_true", help="answer the device check as a T4")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    known, overrides = parser.parse_known_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    route = trace_route(overrides, fake_t4=known.fake_t4)
    if known.json:
        counts = {
            "files": route.files(),
            "reentries": route.reentries(),
            "compositions": route.compositions,
            "reached_fit": route.reached_fit,
        }
        print(json.dumps(counts))
    else:
        print("\n".join(route_lines(route)))
    return 0 if route.reached_fit else 1


if __name__ == "__main__":
    sys.exit(main())
