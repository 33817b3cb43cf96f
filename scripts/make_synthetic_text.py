"""Render the synthetic text-detection dataset ahead of training (ICDAR 2015 layout).

    python scripts/make_synthetic_text.py --root data/synthetic_text --num-train 1500

The folder written is the one ``data=synthetic_text`` would use with the same parameters (the
others keep their defaults from ``SyntheticTextConfig``); an existing complete one is reused.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vramkit.tasks.text_detection.data.synthetic_text import (
    SyntheticTextConfig,
    ensure_synthetic_dataset,
    read_manifest,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = SyntheticTextConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("data/synthetic_text"),
        help="folder that holds the generated datasets (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--num-train", type=int, default=defaults.num_train)
    parser.add_argument("--num-val", type=int, default=defaults.num_val)
    parser.add_argument(
        "--image-size", type=int, default=defaults.image_size, help="square side (px)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="rendering processes (default: all cores)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Generate (or find) the dataset and print where it is and how fast it was rendered."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = SyntheticTextConfig(
        seed=args.seed,
        num_train=args.num_train,
        num_val=args.num_val,
        image_size=args.image_size,
    )
    dataset_dir = ensure_synthetic_dataset(args.root, config, workers=args.workers)
    manifest = read_manifest(dataset_dir) or {}
    counts = manifest.get("counts", {})
    for split, split_counts in counts.items():
        print(
            f"{split}: {split_counts['images']} images, {split_counts['words']} words, "
            f"{split_counts['dont_care']} don't-care"
        )
    print(
        f"{dataset_dir} (created {manifest.get('created')}, "
        f"{manifest.get('images_per_s')} images/s with "
        f"{manifest.get('generation_processes')} process(es))"
    )
    return dataset_dir


if __name__ == "__main__":
    main()
