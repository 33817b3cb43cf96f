"""Evaluate a checkpoint: ``python eval.py ckpt_path=<run>/checkpoints/last.ckpt [+hw=t4]``."""

from vramkit.core.run.long_lived_imports import long_lived_imports

with long_lived_imports(freeze=__name__ == "__main__"):
    import sys

    import hydra
    from omegaconf import DictConfig

    from vramkit.core.run.evaluate import evaluate
    from vramkit.core.run.refusal.exit_codes import refusals_as_messages
    from vramkit.core.run.refusal.override_typos import did_you_mean_on_refusal
    from vramkit.core.run.settling.config_preview import (
        refuse_preview_without_profile,
        show_class_defaults,
    )
    from vramkit.core.run.settling.resolvers import register_resolvers

register_resolvers()  # before Hydra composes: run folders and paths are read through them


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> dict[str, float]:
    with refusals_as_messages():
        return evaluate(cfg)


if __name__ == "__main__":
    refuse_preview_without_profile(sys.argv[1:])  # --resolve needs a profile to read
    show_class_defaults(sys.argv[1:])  # --cfg job prints class defaults as values
    with did_you_mean_on_refusal("eval"):  # a misspelt key: the key it resembles
        main()
