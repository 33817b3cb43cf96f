"""`vramkit` command-line mistakes (one line, exit 2, the closest valid name, no planning), and
`vramkit plan --hf` planning a Hugging Face model from its config."""

from __future__ import annotations

import json

import pytest

from vramkit.cli import main
from vramkit.core.run.settling.compose import forget_composition
from vramkit.core.units import GIB

GPT2_PARAMETERS = 124_439_808  # GPT2Config(): 124.4 M, the LM head tied to the embedding


def test_an_unknown_profile_names_the_closest(capsys):
    status = main(["plan", "--hw", "t44", "--model", "json:dumps", "--data", "json:loads"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "hw=t44: no such hardware profile; did you mean t4?" in error


@pytest.mark.parametrize(
    "what", [["--model", "json:dumps", "--data", "json:loads"], ["--hf", "gpt2"]]
)
def test_both_forms_load_the_profile_the_same_way(capsys, what):
    # One loader for --model and --hf: the same refusal, before any composing or planning.
    status = main(["plan", "--hw", "rtx4090_laptp", *what])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "hw=rtx4090_laptp: no such hardware profile; did you mean rtx4090_laptop?" in error


def test_a_hugging_face_plan_takes_the_precision_it_is_given():
    from vramkit.api import hf_profile
    from vramkit.finetune_options import FinetuneOptions

    profile = hf_profile("rtx4090_laptop", FinetuneOptions(precision="bf16-true"))
    assert profile.precision == "bf16-true"
    assert hf_profile("rtx4090_laptop", FinetuneOptions()).precision == "bf16-mixed"


def test_a_class_that_does_not_import_names_the_closest(capsys):
    status = main(["plan", "--hw", "t4", "--model", "json:dump", "--data", "json:JSONDecodr"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "json has no JSONDecodr; did you mean json:JSONDecoder?" in error


def test_an_unknown_command_names_the_closest(capsys):
    assert main(["plna"]) == 2
    assert "did you mean plan?" in capsys.readouterr().err


def test_a_misspelt_hugging_face_name_names_the_closest(capsys):
    status = main(["plan", "--hw", "t4", "--hf", "gtp2", "--seq-len", "32"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "--hf gtp2: neither a listed checkpoint" in error and "did you mean gpt2?" in error


def test_a_sequence_length_for_images_is_refused(capsys):
    status = main(["plan", "--hw", "t4", "--hf", "vit", "--task", "image_cls", "--seq-len", "64"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "--seq-len does not apply to --task image_cls" in error


def test_plan_hf_gives_train_val_and_an_inference_phase_without_training_state(capsys):
    # GPT-2 from transformers' own config class: nothing is downloaded.
    args = ["--hf", "gpt2", "--task", "causal_lm", "--seq-len", "200", "--batch-size", "2"]
    try:
        status = main(["plan", "--hw", "t4", *args, "--val-batch-size", "2", "--json"])
    finally:
        forget_composition()  # later tests must not see this plan's Hydra settings
    plan = json.loads(capsys.readouterr().out)
    assert status == 0 and plan["fits"] and plan["profile"] == "t4"
    parameters_gib = GPT2_PARAMETERS * 4 / GIB  # fp32 master weights under 16-mixed
    for phase in ("train", "val", "inference"):
        assert plan[phase]["batch_size"] == 2
        assert plan[phase]["breakdown"]["parameters"] == pytest.approx(parameters_gib, abs=1e-3)
    # AdamW's two fp32 moments stay resident through validation inside fit ...
    assert plan["val"]["breakdown"]["optimizer_state"] == pytest.approx(
        2 * parameters_gib, abs=1e-3
    )
    # ... and evaluation on its own holds none of the training state.
    inference = plan["inference"]["breakdown"]
    assert inference["gradients"] == inference["optimizer_state"] == 0
    assert plan["inference"]["peak_at"] == "inference step"
    assert plan["inference"]["peak_gib"] < plan["val"]["peak_gib"]
    # --seq-len reaches the data: the logits of 2 sequences of 200 tokens over the vocabulary.
    shapes = [holder["largest_shape"] for holder in plan["inference"]["peak_holders"]]
    assert [2, 200, 50257] in shapes


def test_train_resolve_without_a_profile_is_one_line(capsys):
    assert main(["train", "--cfg", "job", "--resolve"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --resolve shows the config before the run settles")


def test_extract_features_of_another_task_is_refused_in_one_line_without_a_folder(
    capsys, tmp_path, monkeypatch
):
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    saved = HydraConfig.instance().cfg
    try:
        assert main(["extract-features", "+hw=cpu", "task=arc_teacher"]) == 2
    finally:
        HydraConfig.instance().cfg = saved
        forget_composition()
    (line,) = capsys.readouterr().err.splitlines()
    assert "made for the student's data: run with task=sage_distill" in line
    assert list(tmp_path.iterdir()) == []  # no logs/arc_teacher/features/<time>/ left


def test_export_and_extract_features_are_commands(capsys):
    assert main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert "vramkit export ckpt_path=" in usage and "vramkit extract-features task=" in usage
