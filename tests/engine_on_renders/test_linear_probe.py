"""The linear probe of the photo config: the head fitted on the frozen features first, never a shipped model worse
than the probe, and ``fit --recipe probe`` as an ordinary run that exports and predicts.

The weights are saved here from a randomly initialised network (no download); the images are coloured fields
each class tells apart, which even random features separate.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.callbacks.linear_probe import ProbeChoice
from classifier_engine.cross_validation.final_model import probe_verdict
from classifier_engine.models.linear_probe import fit_linear_probe

from .conftest import PHOTO_ROOT, cli_env, finetune_args, run_cli, write_image_folder
from .test_finetune import default_weights, offline  # noqa: F401  (offline: the fixture)

PROBE_LINE = re.compile(r"validation top-1 ([\d.]+), the figure the fine-tune must beat")
HEAD = "backbone.network.classifier."


def test_the_probe_folds_its_standardization_into_the_head_and_picks_its_strength_on_held_out_folds():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(120) % 3
    features = torch.randn(120, 16, generator=generator) * 5 + 40  # far from standardized
    features[:, 0] += labels * 30  # one informative feature among noise
    groups = torch.arange(120) // 2  # pairs of rows (an image and its mirror) share a fold
    fit = fit_linear_probe(features, labels, groups, classes=3, multilabel=False, folds=4)
    assert fit.weight.shape == (3, 16) and fit.bias.shape == (3,)
    logits = features @ fit.weight.T + fit.bias  # the head on raw features: the standardization is inside
    assert (logits.argmax(1) == labels).float().mean() > 0.9 and fit.folds_score > 0.9
    noise = fit_linear_probe(torch.randn(120, 16, generator=generator), labels, groups, 3, False, folds=4)
    assert noise.l2 > fit.l2  # nothing to learn: the folds choose a stronger pull towards zero
    several = torch.stack([labels == 0, labels == 2], 1).float()  # two labels, a logistic regression each
    multilabel = fit_linear_probe(features, several, groups, classes=2, multilabel=True, folds=4)
    assert ((features @ multilabel.weight.T + multilabel.bias > 0) == several.bool()).float().mean() > 0.9


def test_the_folds_verdict_reads_each_fold_s_choice_as_numbers_only(tmp_path):
    def fold(name: str, **state) -> SimpleNamespace:
        run_dir = tmp_path / name
        (run_dir / "checkpoints").mkdir(parents=True)
        checkpoint = {"state_dict": {}, "hyper_parameters": {}, "callbacks": {"LinearProbe": state}}
        torch.save(checkpoint, run_dir / "checkpoints" / "last.ckpt")
        return SimpleNamespace(run_dir=run_dir)

    probe_won = fold("a", kept="probe", probe_top1=0.9, fine_tune_top1=0.7)
    close = fold("b", kept="fine-tune", probe_top1=0.8, fine_tune_top1=0.85)
    assert probe_verdict([probe_won, close]) == pytest.approx((0.85, 0.775))
    alone = fold("c", kept="probe", probe_top1=float("nan"), fine_tune_top1=float("nan"))  # fit --recipe probe
    crafted = fold("d", kept="probe", probe_top1="0.99", fine_tune_top1=True)  # a string and a bool: not numbers
    unknown = fold("e", kept="os.system", probe_top1=0.9, fine_tune_top1=0.1)
    for other in (alone, crafted, unknown):
        assert probe_verdict([probe_won, other]) is None  # every fold must have compared the two
    assert ProbeChoice.of({"callbacks": "LinearProbe"}) is None and ProbeChoice.of({}) is None
    choice = ProbeChoice.of(torch.load(crafted.run_dir / "checkpoints" / "last.ckpt", weights_only=True))
    assert choice is not None and choice.kept == "probe" and not choice.compared


def last_checkpoint(folder: Path) -> Path:
    (last,) = folder.glob("runs/images/*/checkpoints/last.ckpt")
    return last


@pytest.mark.slow  # two epochs of the default network at 32 px
@pytest.mark.every_render
def test_a_fine_tune_worse_than_its_probe_ships_the_probe(tmp_path, offline):  # noqa: F811
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    spoil = "--trainer.callbacks+=engine_probes.SpoilTheFineTune"  # noise in the weights the final validation judges
    result = run_cli(*finetune_args(photos, weights, spoil), cwd=tmp_path, env=offline)
    output = result.stdout + result.stderr
    probe_top1 = float(PROBE_LINE.search(output).group(1))
    assert "the head first fitted as a linear probe (LP-FT)" in output  # the plan line says so
    kept = re.search(r"LinearProbe: kept the probe: validation top-1 ([\d.]+) against the fine-tune's ([\d.]+)", output)
    assert kept is not None, output[-3000:]
    assert float(kept.group(1)) == probe_top1 > float(kept.group(2))

    last = last_checkpoint(tmp_path)
    checkpoint = torch.load(last, weights_only=True)
    state = checkpoint["callbacks"]["LinearProbe"]
    assert state["kept"] == "probe"
    # The shipped network is the starting one with the probe's head: the weights file's body, untouched.
    shipped, started = checkpoint["state_dict"], torch.load(weights, weights_only=True)
    body = [name for name in started if not name.startswith("classifier.")]
    assert body and all(torch.equal(shipped[f"backbone.network.{name}"], started[name]) for name in body)
    assert torch.equal(shipped[HEAD + "weight"], state["head_weight"])
    assert torch.equal(shipped[HEAD + "bias"], state["head_bias"])
    # What the final validation logged (and calibrated on) is the probe's figure.
    events = EventAccumulator(str(last.parents[1]), size_guidance={"scalars": 0})
    events.Reload()
    assert events.Scalars("val/top1")[-1].value == pytest.approx(probe_top1, abs=1e-6)
    assert events.Scalars("probe/val_top1")[-1].value == pytest.approx(probe_top1, abs=1e-6)


@pytest.mark.slow  # a probe, an export and a predict of the default network at 32 px: the full tier only
def test_the_probe_alone_is_an_ordinary_run_that_exports_and_predicts(tmp_path, offline):  # noqa: F811
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    result = run_cli(*finetune_args(photos, weights, "--recipe=probe"), cwd=tmp_path, env=offline)
    output = result.stdout + result.stderr
    assert "the linear probe alone" in output and "1 epoch of 1 step" in output, output[-3000:]
    last = last_checkpoint(tmp_path)
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["callbacks"]["LinearProbe"]["kept"] == "probe" and checkpoint["calibration"]["fitted_on"]
    started = torch.load(weights, weights_only=True)
    assert torch.equal(checkpoint["state_dict"]["backbone.network.conv_stem.weight"], started["conv_stem.weight"])

    config = last.parents[1] / "config.yaml"
    exported = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "export.py"), f"--ckpt_path={last}", f"--config={config}", "--formats=onnx"],
        cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (last.parent / "export" / "model.card.md").read_text()
    assert "linear probe" in card
    run_cli("predict", "--config", str(config), "--ckpt_path=last", f"--data.predict_dir={photos / 'cat'}",
            cwd=tmp_path, env=offline)  # fmt: skip
    (predictions,) = last.parents[1].glob("predict/*/predictions.csv")
    with predictions.open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 12 and sum(row["predicted"] == "cat" for row in rows) >= 10


@pytest.mark.slow  # two folds and a final model of the default network at 32 px
def test_folds_whose_probes_beat_their_fine_tunes_make_the_final_model_the_probe_alone(tmp_path, offline):  # noqa: F811
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    options = finetune_args(photos, weights, "--trainer.callbacks+=engine_probes.SpoilTheFineTune")[1:]
    command = [sys.executable, str(PHOTO_ROOT / "cross_validate.py"), *options, "--folds=2"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    said = re.search(
        r"Final model: every image of the 2 folds, the linear probe alone: it beat the fine-tune on the folds "
        r"\(([\d.]+) against ([\d.]+)\)",
        result.stdout,
    )
    assert said is not None and float(said.group(1)) > float(said.group(2)), result.stdout[-3000:]
    (final,) = tmp_path.glob("runs/images/*/checkpoints/final.ckpt")
    checkpoint = torch.load(final, weights_only=True)
    choice = ProbeChoice.of(checkpoint)
    assert choice is not None and choice.kept == "probe" and not choice.compared  # the probe alone, on every image
    started = torch.load(weights, weights_only=True)
    assert torch.equal(checkpoint["state_dict"]["backbone.network.conv_stem.weight"], started["conv_stem.weight"])
    assert "linear probe alone" in (final.parent / "export" / "model.card.md").read_text()
