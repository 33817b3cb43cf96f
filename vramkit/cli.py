"""The ``vramkit`` command: plan, train, eval, report, compare, export, extract-features.

    vramkit plan --hw t4 --model my_pkg.mod:MyModule --data my_pkg.mod:MyData [--json] [--verify]
    vramkit plan --hw t4 --hf gpt2 --task causal_lm --seq-len 1024
    vramkit plan --hw rtx4090_laptop --hf meta-llama/Llama-3.1-8B --qlora --lora-r 16 \
        --seq-len 2048 --grad-ckpt [--optimizer paged_adamw_8bit] [--precision bf16-true]
    vramkit train +hw=t4 [Hydra overrides]      (as python train.py)
    vramkit eval ckpt_path=... [Hydra overrides] (as python eval.py)
    vramkit report <run folder> | vramkit compare <run> <run>
    vramkit export ckpt_path=... [Hydra overrides]   (as python scripts/export.py)
    vramkit extract-features task=sage_distill [Hydra overrides]
                                                 (as python scripts/extract_teacher_features.py)

A mistake (an unknown profile, a class that does not import) is one line on stderr, exit 2.
``vramkit plan`` exits 0 when the plan fits (or the profile has no budget), 1 when it does not.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vramkit.core.config.source import closest
from vramkit.unloaded_libraries import keep_unloaded

HF_TASKS = ("causal_lm", "masked_lm", "seq_cls", "image_cls")  # --task (vramkit.api.HF_TASKS)
VERIFY_FILE = "vramkit_verify.json"  # --verify's default output, in the current folder


class UsageError(ValueError):
    """A mistake on the command line: one line, exit 2."""


def _current_folder_on_path() -> None:
    """Put the current folder first on ``sys.path``, as ``python -m`` does: ``vramkit plan
    --model my_pkg.mod:MyModule`` run in the folder holding ``my_pkg/`` imports it (an installed
    console script's ``sys.path`` starts with the script's folder instead)."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def import_object(spec: str, option: str) -> Any:
    """The object ``package.module:Name`` names, importable from the current folder too; a
    `UsageError` naming the closest name."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{option} {spec}: give it as package.module:Name")
    _current_folder_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"{option} {spec}: cannot import {module_name} ({error})") from None
    if not hasattr(module, attribute):
        near = closest(attribute, [name for name in dir(module) if not name.startswith("_")])
        hint = f"; did you mean {module_name}:{near}?" if near else ""
        raise UsageError(f"{option} {spec}: {module_name} has no {attribute}{hint}")
    return getattr(module, attribute)


def _plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vramkit plan", description="Plan a training run's GPU memory, on any machine."
    )
    parser.add_argument("--hw", required=True, help="hardware profile of conf/hw: t4, l4, ...")
    parser.add_argument("--model", help="your LightningModule (or a factory): package.module:Name")
    parser.add_argument("--data", help="your LightningDataModule, built with no arguments")
    parser.add_argument("--hf", help="a Hugging Face config name (gpt2, bert-base-uncased, ...)")
    parser.add_argument("--task", choices=sorted(HF_TASKS), default="causal_lm", help="with --hf")
    parser.add_argument("--seq-len", type=int, help="with --hf: tokens per sample")
    method = parser.add_mutually_exclusive_group()
    for name, what in (
        ("full", "fine-tune every weight"),
        ("lora", "LoRA adapters on the frozen model"),
        ("qlora", "LoRA adapters on a 4-bit model"),
    ):
        method.add_argument(
            f"--{name}", dest="finetune", action="store_const", const=name, help=what
        )
    parser.add_argument("--lora-r", type=int, help="LoRA rank (default 16)")
    parser.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 32)")
    parser.add_argument(
        "--lora-targets", help="Linear layers with adapters: q_proj,v_proj or all-linear"
    )
    parser.add_argument("--quant-type", help="QLoRA 4-bit type: nf4 (default) or fp4")
    parser.add_argument(
        "--no-double-quant", action="store_true", help="QLoRA without double quantization"
    )
    parser.add_argument("--compute-dtype", help="QLoRA compute dtype: bfloat16, float16, float32")
    parser.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    parser.add_argument(
        "--optimizer", help="adamw, adamw_fused, adamw_8bit, paged_adamw_8bit or adafactor"
    )
    parser.add_argument("--precision", help="replaces the profile's: bf16-true, 16-mixed, ...")
    parser.add_argument("--batch-size", type=int, help="plan this training batch (else auto)")
    parser.add_argument("--val-batch-size", type=int, help="plan this validation batch")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-remedies", action="store_true", help="no remedies when over")
    parser.add_argument("--verify", action="store_true", help="then measure real steps (GPU)")
    parser.add_argument("--verify-steps", type=int, default=3, help="steps per phase measured")
    parser.add_argument("--verify-file", default=VERIFY_FILE, help="JSON file the cases join")
    return parser


def _user_plan(args: argparse.Namespace):
    from vramkit.api import load_profile, plan

    profile = load_profile(args.hw)  # a mistake there is refused before the user's code runs
    if not args.model or not args.data:
        raise UsageError("give --model and --data together (package.module:Name each), or --hf")
    module = import_object(args.model, "--model")
    data_class = import_object(args.data, "--data")
    try:
        datamodule = data_class()
    except TypeError as error:
        raise UsageError(
            f"--data {args.data}: cannot build it with no arguments ({error})"
        ) from None
    result = plan(
        module,
        datamodule,
        hw=profile,
        batch_size=args.batch_size,
        val_batch_size=args.val_batch_size,
        remedies=not args.no_remedies,
    )
    return result, module, datamodule


def _check_hf_name(name: str) -> None:
    """Refuse a `--hf` name that is neither a listed checkpoint nor a transformers model type,
    naming the closest, before any composing or planning."""
    from vramkit.tasks.hf_models.configs import NAMED_CONFIGS, resolve_name, transformers_module

    try:
        transformers_module()  # a listed name resolves without it; the plan would not
        resolve_name(name)
    except ImportError as error:
        raise UsageError(f"--hf {name}: {error}") from None
    except ValueError:
        mapping = transformers_module().models.auto.configuration_auto.CONFIG_MAPPING
        near = closest(name, [*NAMED_CONFIGS, *mapping.keys()])
        hint = f"; did you mean {near}?" if near else ""
        raise UsageError(
            f"--hf {name}: neither a listed checkpoint ({', '.join(sorted(NAMED_CONFIGS))}) nor "
            f"a transformers model type{hint}"
        ) from None


def _finetune_options(args: argparse.Namespace):
    """The fine-tuning options of the command line (None without any), and the options every
    Hugging Face plan takes; a bad value is a `UsageError` naming the flag."""
    from vramkit.finetune_options import FinetuneOptionError, FinetuneOptions

    specific = (args.lora_r, args.lora_alpha, args.lora_targets, args.quant_type)
    quantized = args.quant_type is not None or args.no_double_quant or args.compute_dtype
    try:
        common = FinetuneOptions(
            gradient_checkpointing=args.grad_ckpt,
            optimizer=args.optimizer,
            precision=args.precision,
        ).check()
        if args.finetune is None and not quantized and all(v is None for v in specific):
            return None, common
        targets = None if args.lora_targets is None else tuple(args.lora_targets.split(","))
        options = FinetuneOptions(
            method=args.finetune or ("qlora" if quantized else "lora"),
            lora_r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_targets=targets,
            quant_type=args.quant_type,
            double_quant=False if args.no_double_quant else None,
            compute_dtype=args.compute_dtype,
        ).check()
    except FinetuneOptionError as error:
        raise UsageError(str(error)) from None
    return options, common


def _hf_plan(args: argparse.Namespace):
    from vramkit.api import Plan, hf_overrides, hf_profile
    from vramkit.core.config.instantiate import instantiate
    from vramkit.core.planner import plan_task, requested_batch_sizes
    from vramkit.core.planner.request import task_batch_defaults
    from vramkit.core.run.settling.compose import compose_config
    from vramkit.core.run.settling.plan_request_from_config import plan_request, planning_config

    options, common = _finetune_options(args)
    _check_hf_name(args.hf)
    try:
        overrides = hf_overrides(
            args.hf, hw=args.hw, task=args.task, seq_len=args.seq_len, finetune=options
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    profile = hf_profile(args.hw, common)  # the one loader of --model and --hf
    cfg = compose_config("train", overrides + common.common_overrides())
    sizes = requested_batch_sizes(
        profile, task_batch_defaults(cfg), train=args.batch_size, val=args.val_batch_size
    )
    memory_plan = plan_task(
        plan_request(cfg, profile, batch_sizes=sizes, with_remedies=not args.no_remedies)
    )
    planning = planning_config(cfg, profile)
    return Plan.of(memory_plan), lambda: instantiate(planning.model), instantiate(planning.data)


def _verify(args: argparse.Namespace, result, module: Any, datamodule: Any) -> int:
    from vramkit.core.planner.decisions.verify import (
        append_cases,
        comparison_rows,
        comparison_table,
        field_cases,
        require_gpu,
        verify_plan,
    )

    require_gpu()
    import torch

    if isinstance(module, torch.nn.Module):  # the real steps train it: a fresh one is built
        raise UsageError(
            "--verify needs --model to name a class or factory (it builds a fresh one)"
        )
    datamodule.prepare_data()
    datamodule.setup("fit")
    measured = verify_plan(
        result.memory_plan,
        module,
        datamodule.train_dataloader(),
        datamodule.val_dataloader(),
        steps=args.verify_steps,
    )
    print(comparison_table(comparison_rows(result.memory_plan, measured)))
    command = shlex.join(["vramkit", "plan", *sys.argv[2:]])
    model = args.model or f"hf:{args.hf}"
    cases = field_cases(
        result.memory_plan, measured, model=model, command=command, steps=args.verify_steps
    )
    append_cases(Path(args.verify_file), cases)
    print(f"{len(cases)} cases appended to {args.verify_file}")
    return 0


def _planning_imports(args: argparse.Namespace, *, own_process: bool) -> None:
    """Import what the plan runs on with Python's cyclic garbage collector paused, and in a
    process of its own freeze what was imported (`long_lived_imports`, as plan_memory.py does):
    the collections the imports set off free nothing, and later ones would walk those objects
    again. A 1 B QLoRA plan spent 2.4-2.5 s of CPU in the collector, 0.5 s with this. A `--hf`
    plan in a process of its own also keeps the libraries it never runs from loading
    (`keep_unloaded`; not with --verify, whose real model may need them). Call it after
    `hide_library_chatter` (with --verify peft imports bitsandbytes, which prints notes); a
    missing extra is left to the plan, which names it."""
    from vramkit.core.run.long_lived_imports import long_lived_imports

    if args.hf and own_process and not args.verify:
        keep_unloaded()
    flags = (args.lora_r, args.lora_alpha, args.lora_targets, args.quant_type, args.compute_dtype)
    stated = args.no_double_quant or any(value is not None for value in flags)
    adapters = args.finetune in ("lora", "qlora") or (args.finetune is None and stated)
    with long_lived_imports(freeze=own_process), contextlib.suppress(ImportError):
        import lightning.pytorch  # noqa: F401

        import vramkit.api
        import vramkit.core.planner  # noqa: F401

        if args.hf:
            import transformers  # noqa: F401
        if args.hf and adapters:
            import peft  # noqa: F401


def plan_command(argv: Sequence[str], *, own_process: bool = False) -> int:
    """``vramkit plan``: print the plan; with --verify, measure it on this machine's GPU.

    `own_process`: the command is the whole process (the console script), so what it imports
    may be frozen for the garbage collector (`_planning_imports`)."""
    args = _plan_parser().parse_args(argv)
    from vramkit.core.run.library_chatter import hide_library_chatter, output_settings

    # Other libraries' notes (bitsandbytes' optional CPU kernel, ...) off, as plan_memory.py.
    hide_library_chatter(output_settings(None, config_file="conf/train.yaml"))
    _planning_imports(args, own_process=own_process)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from vramkit.core.planner import PlanningError

    try:
        if args.verify:
            from vramkit.core.planner.decisions.verify import require_gpu

            require_gpu()  # before minutes of planning
        if args.hf:
            result, module, datamodule = _hf_plan(args)
        else:
            result, module, datamodule = _user_plan(args)
        print(json.dumps(result.to_json(), indent=2) if args.json else result.table())
        if args.verify:
            return _verify(args, result, module, datamodule)
    except (ValueError, PlanningError, HydraException, OmegaConfBaseException) as error:
        print(f"vramkit plan: error: {error}", file=sys.stderr)
        return 2
    return 1 if result.fits is False else 0


def train_command(argv: Sequence[str]) -> int:
    """``vramkit train <overrides>``: ``python train.py <overrides>``."""
    from vramkit.core.run.train import train
    from vramkit.hydra_app import hydra_app

    return hydra_app("train", train, argv)


def eval_command(argv: Sequence[str]) -> int:
    """``vramkit eval <overrides>``: ``python eval.py <overrides>``."""
    from vramkit.core.run.evaluate import evaluate
    from vramkit.hydra_app import hydra_app

    return hydra_app("eval", evaluate, argv)


def report_command(argv: Sequence[str]) -> int:
    """``vramkit report``: ``python -m vramkit.report``."""
    from vramkit.report import main

    return main(list(argv))


def compare_command(argv: Sequence[str]) -> int:
    """``vramkit compare``: ``python -m vramkit.compare_runs``."""
    from vramkit.compare_runs import main

    return main(list(argv))


def export_command(argv: Sequence[str]) -> int:
    """``vramkit export <overrides>``: ``python scripts/export.py <overrides>``."""
    from vramkit.export_command import main

    return main(argv)


def extract_features_command(argv: Sequence[str]) -> int:
    """``vramkit extract-features <overrides>``: ``python scripts/extract_teacher_features.py``."""
    from vramkit.extract_features_command import main

    return main(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "plan": plan_command,
    "train": train_command,
    "eval": eval_command,
    "report": report_command,
    "compare": compare_command,
    "export": export_command,
    "extract-features": extract_features_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: dispatch to a subcommand; its exit status. Without `argv` (the
    command line of a process of its own) the plan command may freeze its imports."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        near = closest(name, list(COMMANDS))
        hint = f"; did you mean {near}?" if near else ""
        print(
            f"vramkit: error: no command {name}{hint} (one of {', '.join(COMMANDS)})",
            file=sys.stderr,
        )
        return 2
    if name == "plan":
        return plan_command(rest, own_process=own_process)
    return COMMANDS[name](rest)


if __name__ == "__main__":
    sys.exit(main())
