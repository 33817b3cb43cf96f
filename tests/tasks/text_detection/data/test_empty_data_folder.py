"""A data folder with nothing to train on is refused by the config checks, naming key and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.run.refusal.exit_codes import REFUSALS
from vramkit.tasks.text_detection.data.icdar_folder import DataError, TextDetectionDataset


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ((), "no images folder ROOT/images: expected images/<stem>{.jpg,.jpeg,.png,.bmp}"),
        (("images/",), "no images in ROOT/images: expected images/<stem>{.jpg,.jpeg,.png,.bmp}"),
        (
            ("images/img_1.jpg", "gt/gt_img_2.txt"),
            "no image in ROOT/images has its ground-truth file in ROOT/gt: expected",
        ),
    ],
)
def test_an_empty_train_dir_is_a_refusal_naming_key_file_and_layout(
    compose_config, tmp_path: Path, toy_icdar_dir: Path, layout: tuple[str, ...], problem: str
) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    for name in layout:  # a folder ends with "/", a file is empty: only names are checked
        path = root / name
        if name.endswith("/"):
            path.mkdir()
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"")
    sizes = ("hw.batch_size=2", "hw.val_batch_size=2")  # settled sizes: "auto" is a run's to plan
    cfg = compose_config(
        "data=icdar2015",
        f"data.train_dir={root}",
        f"data.val_dir={toy_icdar_dir}",
        "+hw=cpu",
        *sizes,
    )
    with pytest.raises(ConfigError) as caught:
        instantiate(cfg.data)
    assert isinstance(caught.value, REFUSALS)  # train.py: its message alone, exit 2
    assert caught.value.keys == ("train_dir",)
    message = str(caught.value)
    assert "conf/data/icdar2015.yaml" in message
    assert f"data.train_dir: {problem.replace('ROOT', str(root))}" in message
    assert "with gt/gt_<stem>.txt" in message


def test_the_dataset_built_in_code_says_the_same(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match=rf"no images in {tmp_path / 'images'}: expected"):
        TextDetectionDataset(tmp_path, None)
