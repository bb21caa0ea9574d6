"""The model contract and the guarantees the CLI installs whatever the model does.

A project's LightningModule is the user's to rewrite; exact resume and calibrated answers must not
depend on what its steps do (``machinery/model_guarantees.py``), and a model that lacks part of the
contract (``classifier_engine.ClassifierModel``) is refused in one line before anything is built.
"""

from __future__ import annotations

import inspect
import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import classifier_engine
from classifier_engine.machinery.model_guarantees import TrainingTotalsLog

from .conftest import cli_env, fit_args, only_run_dir, tree, write_tiny_archive
from .test_exact_resume import assert_same_run, scalars

SCRIPT = Path(__file__).parent / "support" / "rewritten_model.py"


def run_as(command: str, model: str, *args: str, cwd: Path, env: dict[str, str] | None = None):
    """``python main.py ARGS`` (or ``export.py``) of the CIFAR render with ``model`` as its LightningModule."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), command, model, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(**(env or {})),
    )


def test_every_public_name_resolves_and_says_what_it_is_for():
    for name in classifier_engine.__all__:
        value = getattr(classifier_engine, name)
        if inspect.isclass(value) or inspect.isfunction(value):  # type aliases and constants aside
            assert (value.__doc__ or "").strip(), f"classifier_engine.{name} has no docstring"
    with pytest.raises(AttributeError, match="no attribute 'ImageClassifier'"):
        classifier_engine.ImageClassifier  # noqa: B018  (the project's, never the library's)


def test_a_renamed_public_name_keeps_working_with_a_warning(monkeypatch):
    monkeypatch.setitem(classifier_engine._RENAMED, "BatchAugmentation", "BatchAugment")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert classifier_engine.BatchAugmentation is classifier_engine.BatchAugment
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "classifier_engine.BatchAugment" in str(caught[0].message)


def test_a_model_without_a_method_of_the_contract_is_refused_in_one_line_before_anything_is_written(tmp_path):
    write_tiny_archive(tmp_path / "data")
    before = tree(tmp_path)
    result = run_as("main", "NoFeatures", *fit_args("data"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: NoFeatures lacks features() of classifier_engine.ClassifierModel; "
                     "add them (the project's models/classifier.py shows each one)"]  # fmt: skip
    assert tree(tmp_path) == before


def test_training_totals_count_mixed_images_as_their_larger_share_and_a_bare_loss_as_a_loss():
    totals = TrainingTotalsLog()
    model = SimpleNamespace(class_names=["a", "b", "c"], multilabel=False, log=lambda *args, **kwargs: None)
    trainer = SimpleNamespace(log_every_n_steps=0, should_stop=False, global_step=1)
    totals.setup(trainer, model, "fit")
    shares = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4], [0.2, 0.0, 0.8], [1.0, 0.0, 0.0]])
    logits = torch.tensor([[2.0, 0, 0], [0, 0, 3.0], [0, 0, 1.0], [0, 1.0, 0]])
    totals.on_train_batch_end(trainer, model, {"loss": torch.tensor(0.5), "logits": logits}, (None, shares), 0)
    assert totals.totals.images == 4 and int(totals.totals.sums[1]) == 2  # images 0 and 2: their larger share
    strategy = SimpleNamespace(root_device=torch.device("cpu"), world_size=1)
    assert set(totals.totals.means(strategy)) == {"train/loss_epoch", "train/top1", "train/top5"}
    totals.on_train_batch_end(trainer, model, {"loss": torch.tensor(0.25)}, (None, torch.tensor([0, 1])), 1)
    means = totals.totals.means(strategy)
    assert set(means) == {"train/loss_epoch"}  # no logits, no accuracy to claim
    assert float(means["train/loss_epoch"]) == pytest.approx((0.5 * 4 + 0.25 * 2) / 6)


@pytest.mark.slow
@pytest.mark.every_render  # the template's CI runs it too
def test_steps_rewritten_by_the_user_keep_exact_resume_after_sigterm_and_the_card_s_calibration(tmp_path):
    killable = "--trainer.callbacks+=engine_probes.KillAt"
    args = [*fit_args("data"), "--trainer.max_epochs=2", "--data.batch_size=8", killable]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    for root in (reference, resumed):
        write_tiny_archive(root / "data")
    finished = run_as("main", "PlainSteps", *args, cwd=reference)
    assert finished.returncode == 0, finished.stderr[-3000:]
    sigterm = {"KILL_AT": "train_batch:1:6", "KILL_SIGNAL": "SIGTERM"}
    stopped = run_as("main", "PlainSteps", *args, cwd=resumed, env=sigterm)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    finished = run_as("main", "PlainSteps", *args, "--ckpt_path=last", cwd=resumed)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_run(reference, resumed)  # weights, optimizer, schedule, loops and every scalar
    logged = scalars(only_run_dir(resumed))
    assert "train/loss_epoch" in logged and "train/top1" not in logged  # a bare loss: no accuracy claimed
    assert {"val/ece", "val/ece_uncalibrated"} <= logged.keys()

    ckpt = only_run_dir(resumed) / "checkpoints" / "last.ckpt"
    calibration = torch.load(ckpt, weights_only=True)["calibration"]
    assert calibration["fitted_on"]["images"] == 32  # the validation split, fitted after the last validation
    assert calibration["temperature"] != [1.0]
    # The model's package here is the test's, so the render's network is trusted by name (as a user would).
    classes = ("models.backbones.FastCNN", "models.schedules.OneCycle", "data.CifarDataModule")
    trust = [option for name in classes for option in ("--trust", f"cifar_classifier.{name}")]
    exported = run_as("export", "PlainSteps", "--ckpt_path", str(ckpt), "--data_dir", "data", "--formats", "onnx",
                      *trust, cwd=resumed)  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = json.loads((ckpt.parent / "export" / "model.card.json").read_text())
    assert card["calibration"]["temperature"] == calibration["temperature"]
    assert card["calibration"]["fitted_on"]["images"] == 32
