"""metrics.csv read back: each value with its step and epoch, per-epoch metrics told apart."""

from __future__ import annotations

from fake_run_folder import write_fake_run

from vramkit.core.report.run_metrics import find_metrics_csv, read_metrics


def test_series_keep_step_and_epoch_of_every_value(tmp_path):
    run = write_fake_run(tmp_path / "run")
    metrics = read_metrics(find_metrics_csv(run))
    loss = metrics["train/loss"]
    assert (loss.steps, loss.epochs, loss.values) == (
        [0, 1, 2, 3],
        [0, 0, 1, 1],
        [2.0, 1.5, 1.0, 0.5],
    )
    assert not loss.per_epoch
    hmean = metrics["val/hmean"]
    assert (hmean.epochs, hmean.values) == ([0, 1], [0.25, 0.75])
    assert hmean.per_epoch
    # learning-rate rows have no epoch: they take the epoch of the row before
    assert metrics["lr-AdamW"].epochs == [0, 0, 0, 1]
    assert not metrics["lr-AdamW"].per_epoch


def test_the_newest_csv_logger_version_is_read(tmp_path):
    run = write_fake_run(tmp_path / "run")
    newer = run / "csv" / "version_1" / "metrics.csv"
    newer.parent.mkdir()
    newer.write_text("epoch,step,train/loss\n0,0,9.0\n")
    assert find_metrics_csv(run) == newer
    assert find_metrics_csv(tmp_path / "nothing") is None
