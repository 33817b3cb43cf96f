"""No private name of Lightning, torch, Hydra or OmegaConf outside vramkit/core/compat and the
planner (issue #35, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

import vramkit
from tests.core.compat.private_name_scan import library_private_names, private_uses

REPO = Path(vramkit.__file__).resolve().parents[1]
# The planner models torch internals on purpose (its rules are checked per torch version in
# vramkit/core/planner/cuda); the compat modules are the one door for everything else.
FENCED = (REPO / "vramkit" / "core" / "compat", REPO / "vramkit" / "core" / "planner")


def _checked_files() -> list[Path]:
    files = [*(REPO / "vramkit").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    files += [REPO / "train.py", REPO / "eval.py"]
    return sorted(path for path in files if not any(path.is_relative_to(f) for f in FENCED))


def test_no_private_name_of_a_library_outside_the_compat_modules_and_the_planner():
    uses = {
        str(path.relative_to(REPO)): found
        for path in _checked_files()
        if (found := private_uses(path.read_text()))
    }
    assert uses == {}, "go through vramkit/core/compat (one module per library): " + repr(uses)


@pytest.mark.parametrize(
    "source",
    [
        "from torch.utils._pytree import tree_flatten",
        "from lightning.fabric.utilities.types import _Stateful",
        "import torch._dynamo",
        "import torch\nnorms = torch._foreach_norm(xs, 2)",
        "from torch import nn\nclass B(nn.modules.batchnorm._BatchNorm): ...",
        "trainer = module._trainer",
        "step = trainer.fit_loop.epoch_loop._batches_that_stepped",
        "value = job_return._return_value",
        "parent = node._get_parent()",
        "callback._every_n_train_steps < 1",
        "getattr(module, '_compiled_call_impl', None)",
        "summary._flop_counter = counter",
        "class M(LightningModule):\n    def f(self):\n        return self._trainer",
    ],
)
def test_the_scan_finds_each_kind_of_private_use(source):
    assert private_uses(source), source


@pytest.mark.parametrize(
    "source",
    [
        "self._trainer = trainer",  # an object's own attribute
        "def f(self):\n    self._trainer: object = None\n    return self._trainer",
        "value = super()._means(output)",
        "node._target_",  # Hydra's documented config key
        "point._fields",  # the namedtuple API
        "cache._check_files()",  # vramkit's own name, which no library defines
        "import os\nos._Environ",  # the standard library is out of scope
    ],
)
def test_the_scan_passes_what_is_not_a_librarys_private_name(source):
    assert private_uses(source) == [], source


def test_the_library_names_are_read_from_the_installed_sources():
    names = library_private_names()
    assert {"_trainer", "_checkpoint_connector", "_return_value", "_get_parent"} <= names
    assert "_check_files" not in names
