"""`python scripts/plan_memory.py +hw=t4 …` on the default text detection task (tiny data)."""

from __future__ import annotations

import gc
import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from hydra.core.hydra_config import HydraConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plan_memory.py"


@pytest.fixture(scope="module")
def plan_memory():
    spec = importlib.util.spec_from_file_location("plan_memory_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    HydraConfig.instance().cfg = None  # later tests must not see the script's Hydra settings


def test_importing_the_script_leaves_the_garbage_collector_as_it_was():
    # The script pauses collection while importing and freezes what it imported only when run
    # as a script; imported (as here), a freeze would keep the importer's garbage for good.
    frozen = gc.get_freeze_count()
    spec = importlib.util.spec_from_file_location("plan_memory_gc_check", SCRIPT)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


@pytest.mark.slow
def test_json_plan_of_the_default_task_on_a_t4(plan_memory, shared_data_dir, capsys):
    status = plan_memory.main(
        ["+hw=t4", "debug=smoke", f"paths.data_dir={shared_data_dir}", "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert status == 0
    assert plan["profile"] == "t4" and plan["precision"] == "16-mixed"
    assert plan["budget_gib"] == pytest.approx(14.6 * 0.85, abs=0.01)
    assert plan["fits"] is True and plan["remedies"] == []
    for phase, samples in (("train", 16), ("val", 4)):  # the smoke dataset's sizes
        assert plan[phase]["searched"] is True
        assert plan[phase]["batch_size"] == samples  # everything fits: all samples in one batch
        breakdown = plan[phase]["breakdown"]
        assert breakdown["parameters"] > 0 and breakdown["optimizer_state"] > 0
        assert plan[phase]["peak_gib"] == breakdown["total"] <= plan["budget_gib"]
        holders = plan[phase]["peak_holders"]
        assert holders and {"where", "kind", "gib", "tensors", "largest_shape"} <= set(holders[0])
        assert sum(h["gib"] for h in holders) <= breakdown["total"] - breakdown["overhead"] + 1e-3
        # DBNet convolves: the max_allocated moment carries a cuDNN workspace at its op, at its
        # estimate, which the budgeted peak keeps room for.
        kinds = {h["kind"] for h in plan[phase]["max_allocated_holders"]}
        assert "workspace" in kinds
        assert plan[phase]["max_allocated_estimate_gib"] < plan[phase]["peak_gib"]
    assert plan["allowances"]["cuda_context_gib"] == 0.6  # lazy module loading (cuda_rules.py)


def test_print_config_prints_the_run_settled_for_the_profiles_gpu(
    plan_memory, shared_data_dir, capsys
):
    status = plan_memory.main(
        ["+hw=t4", "debug=smoke", f"paths.data_dir={shared_data_dir}", "--print-config"]
    )
    run = yaml.safe_load(capsys.readouterr().out)
    assert status == 0
    # planned on the T4 (this machine has none): every smoke sample fits in one batch
    assert (run["data"]["batch_size"], run["data"]["val_batch_size"]) == (16, 4)
    assert run["hw"]["batch_size"] == 16 and run["trainer"]["precision"] == "16-mixed"
    assert run["data"]["num_workers"] == 0  # debug=smoke's, over the profile's 2


def test_a_profile_typo_is_an_error_naming_the_key(plan_memory, capsys):
    status = plan_memory.main(["+hw=t4", "+hw.precison=16-mixed"])
    error = capsys.readouterr().err
    assert status == 2
    assert "hw.precison" in error and "did you mean hw.precision?" in error


def test_a_users_own_module_and_datamodule_are_planned(plan_memory, monkeypatch, capsys):
    # docs/planner.md's recipe: drop the task's model and data, name your own classes, and let the
    # datamodule read the planned batch sizes through ${hw.…}.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "core" / "planner"))
    status = plan_memory.main(
        [
            "+hw=t4",
            "~model",
            "~data",
            "+model._target_=planning_models.TinyConvClassifier",
            "+model.optimizer={_target_:torch.optim.AdamW,_partial_:true}",
            "+data._target_=planning_models.RandomImageDataModule",
            "+data.batch_size=${hw.batch_size}",
            "+data.val_batch_size=${hw.val_batch_size}",
            "+data.train_length=64",
            "+data.val_length=16",
            "--json",
        ]
    )
    plan = json.loads(capsys.readouterr().out)
    assert status == 0 and plan["fits"] is True
    assert (plan["train"]["batch_size"], plan["val"]["batch_size"]) == (64, 16)  # all fit
    assert plan["optimizer"] == "AdamW" and plan["train"]["peak_gib"] > 0


def test_a_missing_teacher_checkpoint_is_a_message_not_a_traceback(plan_memory, tmp_path, capsys):
    status = plan_memory.main(
        ["+hw=t4", "task=sage_distill", f"paths.log_dir={tmp_path}", "teacher.checkpoint=latest"]
    )
    error = capsys.readouterr().err
    assert status == 2
    assert error.startswith("plan_memory: error: teacher.checkpoint=latest")
    assert "Traceback" not in error and "task=arc_teacher" in error
