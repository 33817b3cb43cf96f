"""`vramkit plan --hf` with fine-tuning options, and `vramkit.plan_hf`: each option reaches the
causal-LM workload's config, and a bad value is one line naming the flag and the closest value."""

from __future__ import annotations

import pytest

from vramkit.api import hf_overrides, plan_hf
from vramkit.cli import main
from vramkit.finetune_options import FinetuneOptions


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--qlora", "--quant-type", "nf5"],
            "--quant-type nf5: not one of nf4, fp4; did you mean nf4?",
        ),
        (["--optimizer", "adamw8bit"], "did you mean adamw_8bit?"),
        (["--precision", "bf16-tru"], "did you mean bf16-true?"),
        (["--qlora", "--compute-dtype", "bfloat15"], "did you mean bfloat16?"),
        (["--lora", "--lora-r", "0"], "--lora-r 0: an adapter rank is at least 1"),
        (["--lora", "--quant-type", "nf4"], "apply to --qlora only"),
        (["--full", "--lora-r", "8"], "apply to --lora and --qlora only"),
        (["--qlora", "--task", "seq_cls"], "--task seq_cls trains every weight"),
    ],
)
def test_a_bad_fine_tuning_flag_is_one_line_naming_it(capsys, flags, message):
    status = main(["plan", "--hw", "t4", "--hf", "gpt2", *flags])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1, error
    assert message in error


def test_the_flags_become_the_causal_lm_workloads_overrides():
    options = FinetuneOptions(
        method="qlora",
        lora_r=16,
        lora_alpha=8.0,
        lora_targets=("q_proj", "v_proj"),
        quant_type="fp4",
        double_quant=False,
        compute_dtype="float16",
        gradient_checkpointing=True,
        optimizer="paged_adamw_8bit",
        precision="bf16-true",
    ).check()
    overrides = hf_overrides("Llama-3.1-8B", hw="t4", seq_len=2048, finetune=options)
    assert overrides == [
        "+hw=t4",
        "task=causal_lm",
        "model=causal_lm",
        "data=hf_random_tokens",
        "model.finetune=qlora",
        "model.lora.r=16",
        "model.lora.alpha=8.0",
        "model.lora.target_modules=[q_proj,v_proj]",
        "model.qlora.quant_type=fp4",
        "model.qlora.double_quant=false",
        "model.qlora.compute_dtype=float16",
        "model.gradient_checkpointing=true",
        "model.optimizer._target_=bitsandbytes.optim.PagedAdamW8bit",
        "hw.precision=bf16-true",
        "model.config=Llama-3.1-8B",
        "data.seq_len=2048",
    ]
    # Without fine-tuning options the plan stays task=hf_models (every weight trains).
    assert hf_overrides("gpt2", hw="t4")[1] == "task=hf_models"


@pytest.mark.slow
def test_plan_hf_plans_lora_and_qlora_of_a_shipped_llm():
    pytest.importorskip("peft", reason="LoRA needs `peft`")
    common = {"hw": "t4", "seq_len": 64, "batch_size": 1, "val_batch_size": 1, "remedies": False}
    lora = plan_hf("EleutherAI/pythia-160m", finetune="lora", lora_r=8, **common)
    qlora = plan_hf("EleutherAI/pythia-160m", finetune="qlora", lora_r=8, **common)
    lora_parts, qlora_parts = lora.train.breakdown, qlora.train.breakdown
    # The 4-bit base holds its Linear weights in about an eighth of fp32's bytes ...
    assert qlora_parts["parameters"] < 0.8 * lora_parts["parameters"]
    # ... and both train the same adapters: the same optimizer state, far below a full model's.
    assert qlora_parts["optimizer_state"] == pytest.approx(lora_parts["optimizer_state"])
    assert 0 < lora_parts["optimizer_state"] < 0.05 * lora_parts["parameters"]
