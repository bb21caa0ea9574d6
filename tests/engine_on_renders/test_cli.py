"""The command line as a user types it: real ``python main.py`` processes on a tiny archive."""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from cifar_classifier.models import ImageClassifier
from engine_probes import TinyNet
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.cli.trainer_cli import TrainerCLI, main
from classifier_engine.export.errors import ExportError
from classifier_engine.export.model_loading import load_model
from classifier_engine.runs.identity import RunIdentity
from classifier_engine.runs.run import Run

from .conftest import (
    DATASET,
    FAST_ARGS,
    PROJECT_ROOT,
    default_config,
    fit_args,
    only_run_dir,
    run_cli,
    write_tiny_archive,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real 1-epoch fit through the CLI, shared by the tests that inspect or reuse it."""
    root = tmp_path_factory.mktemp("run")
    write_tiny_archive(root / "data")
    result = run_cli(*fit_args(root / "data"), cwd=root)
    return root, only_run_dir(root), result


def test_fit_writes_checkpoints_logs_and_config(trained):
    _, run_dir, _ = trained
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)  # everything stored is plain data
    assert checkpoint["epoch"] == 0 and checkpoint["global_step"] == (192 - 32) // 16
    model = ImageClassifier.load_from_checkpoint(last)
    assert model.backbone[-1].in_features == 4 * 4 and model.class_names == list(DATASET.class_names)
    assert model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)).shape == (1, len(DATASET.class_names))
    events = EventAccumulator(str(run_dir), size_guidance={"histograms": 0, "images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"val/top1", "val/top5", "val/loss", "train/loss_step", "train/top1"} <= set(tags["scalars"])
    # The default callbacks, as configured in the default config.
    assert {"train/lr", "weights_grad_norm/total", "train/device/samples_per_sec"} <= set(tags["scalars"])
    assert not any(tag.startswith("amp/") for tag in tags["scalars"])  # fp32: no loss scaler, nothing to chart
    assert f"val_class_top1/{DATASET.class_names[0]}" in tags["scalars"]
    assert [e.step for e in events.Histograms("weights_grad/backbone.0.weight")] == [0]
    assert [e.step for e in events.Histograms("weights/backbone.0.weight")] == [0]
    assert {"train/augmented_batch", "val/confusion_matrix"} <= set(tags["images"])
    # The figure sits at the step of the val/* scalars of its validation (Lightning's: one before global_step).
    assert [e.step for e in events.Images("val/confusion_matrix")] == [e.step for e in events.Scalars("val/top1")]
    assert [e.step for e in events.Scalars("val/top1")] == [checkpoint["global_step"] - 1]
    assert "model/cost/text_summary" in tags["tensors"]  # the model's cost, in the TEXT tab
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["backbone"]["init_args"]["width"] == 4 and config["data"]["init_args"]["batch_size"] == 16
    # Where files go is recorded as given, not as placed, so config.yaml names this run again from anywhere.
    assert config["trainer"]["logger"]["init_args"]["version"] is None and config["ckpt_path"] is None


@pytest.mark.slow  # a process start; test_runs.py's table of mistakes holds it too
def test_same_command_again_refuses_to_start_over(trained):
    root, run_dir, _ = trained
    before = sorted(p.name for p in run_dir.rglob("*"))
    result = run_cli(*fit_args(root / "data"), cwd=root, check=False)
    assert result.returncode != 0
    assert "already holds checkpoints" in result.stderr and "--ckpt_path last" in result.stderr
    # The run's own config.yaml names the same run (where files go and launch switches are not its identity).
    again = run_cli("fit", "--config", str(run_dir / "config.yaml"), cwd=root, check=False)
    assert again.returncode == 2 and f"{run_dir.relative_to(root)} already holds checkpoints" in again.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def eval_args(data_dir, last):
    args = ["--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={data_dir}", f"--ckpt_path={last}"]
    return [a for a in args if not a.startswith("--trainer.max_epochs")]


def test_test_a_checkpoint_logs_inside_its_run(trained):
    root, run_dir, _ = trained
    last = run_dir / "checkpoints" / "last.ckpt"
    result = run_cli("test", *eval_args(root / "data", last), cwd=root)
    assert f"Loaded model weights from the checkpoint at {last}" in result.stderr + result.stdout
    test_dir = next((run_dir / "test").iterdir())
    events = EventAccumulator(str(test_dir))
    events.Reload()
    assert "test/top1" in events.Tags()["scalars"]
    # The evaluation report of CIFAR: every class, and its rows named by the test file's rows.
    page = (test_dir / "report.html").read_text()
    class_names = torch.load(last, weights_only=True)["hyper_parameters"]["class_names"]
    assert all(f'<td class="text">{name}</td>' in page for name in class_names)
    mistakes = list(csv.DictReader((test_dir / "mistakes.csv").read_text().splitlines()))
    assert mistakes and mistakes[0]["image"].startswith("test row ") and page.count("<figure>") == len(mistakes)


def test_test_with_a_runs_config_and_last_evaluates_that_run_not_the_latest_one(trained):
    root, run_dir, _ = trained
    decoy = run_dir.parent / "0decoy0decoy"  # a later run of the same experiment (check_labels.py makes such)
    shutil.copytree(run_dir / "checkpoints", decoy / "checkpoints")
    try:
        (decoy / "checkpoints" / "last.ckpt").touch()  # the most recently written last.ckpt
        for subcommand in ("test", "validate"):
            result = run_cli(subcommand, "--config", str(run_dir / "config.yaml"), "--ckpt_path=last", cwd=root)
            assert f"of {run_dir.relative_to(root)}/checkpoints/last.ckpt" in result.stdout + result.stderr
    finally:
        shutil.rmtree(decoy)


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")
@pytest.mark.filterwarnings("ignore:The dirpath has changed.*:UserWarning")  # evaluation logs beside the run
def test_validate_and_predict_a_checkpoint(trained, monkeypatch):
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    last = run_dir / "checkpoints" / "last.ckpt"
    validated = TrainerCLI(ImageClassifier, args=["validate", *eval_args(root / "data", last)])
    assert 0.0 <= validated.trainer.callback_metrics["val/top1"] <= 1.0
    assert (run_dir / "validate").is_dir()
    predicted = TrainerCLI(
        ImageClassifier, args=["predict", *eval_args(root / "data", last), "--return_predictions=true"]
    )
    answers = predicted.trainer.predict_loop.predictions
    probabilities = torch.cat([answer["probabilities"] for answer in answers])
    assert torch.cat([answer["answered"] for answer in answers]).dtype == torch.bool
    assert probabilities.shape[0] == 64
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(64), atol=1e-5)


def main_output(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """``main.py ARGS`` in this process (no interpreter start), for commands that print and exit."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    with pytest.raises(SystemExit) as exited:
        main(ImageClassifier, default_config(), list(args))
    assert exited.value.code in (0, None)
    return capsys.readouterr().out


def test_print_config_shows_the_resolved_config(tmp_path, monkeypatch, capsys):
    args = (
        "--config",
        str(default_config()),
        "--model.backbone=cifar_classifier.models.backbones.FastCNN",
        "--model.backbone.width=8",
        "--print_config",
    )
    config = yaml.safe_load(main_output(tmp_path, monkeypatch, capsys, "fit", *args))
    assert config["model"]["backbone"]["init_args"]["width"] == 8
    assert config["data"]["class_path"] == "cifar_classifier.data.CifarDataModule"
    assert config["data"]["init_args"]["dataset"] == "cifar10"
    assert "num_classes" not in config["model"]  # linked from the data, not typed twice
    assert not (tmp_path / "runs").exists()


def test_every_option_can_come_from_the_environment_and_the_command_line_wins(tmp_path, data_dir):
    # What a launcher does: set a value in the environment instead of editing a file.
    launcher = {"PL_FIT__TRAINER__LIMIT_TRAIN_BATCHES": "3", "PL_FIT__TRAINER__MAX_EPOCHS": "5"}
    run_cli(*fit_args(data_dir), cwd=tmp_path, env=launcher)  # fit_args gives --trainer.max_epochs=1
    run_dir = only_run_dir(tmp_path)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["limit_train_batches"] == 3 and config["trainer"]["max_epochs"] == 1
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3


@pytest.mark.parametrize(
    ("arg", "complaint"),
    [
        ("--model.widht=4", "error: unrecognized arguments: --model.widht=4; see main.py fit --help"),
        ("--data.batch_size=many", "error: data.batch_size: expected int, got many; see"),
        ("--model.backbone=vgg", "error: model.backbone: Expected a path but vgg either not accessible"),
        ("--model.backbone.depth=20", "error: model.backbone.depth: expected one of 18, 34, 50, got 20; see"),
        ("--data.dataset=cifar11", "error: data.dataset: expected one of 'cifar10', 'cifar100', got cifar11; see"),
    ],
)
def test_bad_config_is_refused_in_one_line_with_the_key_named(tmp_path, monkeypatch, capsys, arg, complaint):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    network = ["--model.backbone=cifar_classifier.models.backbones.CifarResNet"] if "depth" in arg else []
    with pytest.raises(SystemExit) as exit_info:
        main(ImageClassifier, default_config(), ["fit", *network, arg])
    errors = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(errors) == 1 and errors[0].startswith(complaint)
    monkeypatch.setenv("FULL_ERROR", "1")  # jsonargparse's own report, usage included
    with pytest.raises(SystemExit):
        main(ImageClassifier, default_config(), ["fit", *network, arg])
    assert "usage:" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")
def test_a_trainer_setting_lightning_refuses_is_one_line_and_leaves_no_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(ImageClassifier, default_config(), ["fit", "--trainer.max_epochs=-3"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and line.startswith("error: trainer: `max_epochs` must be a non-negative integer")
    assert line.endswith("You passed in -3; fix that value in the config or on the command line")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("setting", ["val_check_interval", "check_val_every_n_epoch", "log_every_n_steps"])
def test_a_count_of_zero_lightning_would_divide_by_is_refused_before_the_run(tmp_path, monkeypatch, capsys, setting):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(ImageClassifier, default_config(), ["fit", f"--trainer.{setting}=0"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2
    fix = "fix that value in the config or on the command line"
    assert line == f"error: trainer.{setting} must be above 0, got 0; {fix}"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("key", ["callbacks", "callbacks+"])
def test_a_stacked_config_that_replaces_the_callbacks_list_says_which_it_leaves_out(tmp_path, monkeypatch, caplog, key):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"trainer:\n  {key}:\n    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n")
    with pytest.raises(SystemExit):  # a refused count ends the command once the configs are stacked
        main(ImageClassifier, default_config(), ["fit", "--config", str(mine), "--trainer.log_every_n_steps=0"])
    notes = [message for message in caplog.messages if message.startswith("Note: ")]
    if key == "callbacks+":  # appended to: nothing is left out
        assert notes == []
        return
    (note,) = notes
    assert note.startswith(f"Note: the trainer.callbacks list of {mine} replaces the one before it, so ")
    assert "ModelCheckpoint" in note and "LearningRateMonitor" not in note
    assert note.endswith(" are not used (trainer.callbacks+: adds to a list instead)")


@pytest.mark.parametrize("preset", ["fast_dev_run", "debug"])
def test_small_presets_stack_on_the_default_config(tmp_path, monkeypatch, preset):
    write_tiny_archive(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    preset_path = PROJECT_ROOT / "configs" / "presets" / f"{preset}.yaml"
    cli = TrainerCLI(
        ImageClassifier,
        args=[
            "fit",
            "--config",
            str(default_config()),
            "--config",
            str(preset_path),
            *FAST_ARGS,
            "--data.data_dir=data",
        ],
    )
    assert cli.trainer.state.finished
    if preset == "debug":
        assert cli.trainer.global_step == 10 and cli.trainer._detect_anomaly
    else:
        assert cli.trainer.global_step == 2 and not list(tmp_path.glob("runs/*/*/checkpoints/*.ckpt"))


def test_slurm_script_is_valid_bash():
    script = PROJECT_ROOT / "scripts" / "slurm.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert "--config configs/presets/ddp.yaml" in script.read_text()


@pytest.mark.slow  # two process starts; the quick tier checks an own network's contract in test_model.py
def test_an_own_network_plugs_in_through_the_config_alone(tmp_path):
    write_tiny_archive(tmp_path / "data")
    own = [f"--model.backbone={TinyNet.__module__}.TinyNet", "--model.backbone.hidden=6"]
    run_cli(*fit_args("data", *own), cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["backbone"] == {"class_path": f"{TinyNet.__module__}.TinyNet", "init_args": {"hidden": 6}}
    last = run_dir / "checkpoints" / "last.ckpt"
    weights = torch.load(last, weights_only=True)["state_dict"]
    assert weights["backbone.1.weight"].shape == (6, 3 * 32 * 32)
    assert weights["backbone.3.weight"].shape == (len(DATASET.class_names), 6)
    # Evaluation rebuilds the network from the checkpoint's record of it.
    result = run_cli("test", "--config", str(default_config()), *FAST_ARGS, "--data.data_dir=data", "--ckpt_path=last",
                     *own, cwd=tmp_path)  # fmt: skip
    assert "test/top1" in result.stdout
    assert isinstance(ImageClassifier.load_from_checkpoint(last).backbone, TinyNet)
    # A network the checkpoint names and the config does not is refused in one line, and nothing is imported for it:
    # a checkpoint is data (test_untrusted_files.py, test_checkpoint_fuzz.py), with or without the run's config.
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["hyper_parameters"]["backbone"]["class_path"] = "not_installed.TinyNet"
    torch.save(checkpoint, tmp_path / "moved.ckpt")
    for config in ([], ["--config", str(run_dir / "config.yaml")]):
        with pytest.raises(
            ExportError, match=r"hyper_parameters\.backbone\.class_path names not_installed\.Tiny"
        ) as no:
            load_model(tmp_path / "moved.ckpt", ImageClassifier, default_config(), config)
        assert "\n" not in str(no.value) and "not_installed" not in sys.modules


@pytest.mark.parametrize("short_hash", ["0a1b2c3d4e5f", "727264334204"], ids=["hex", "all-digits"])
def test_the_loggers_write_into_the_run_folder_whatever_its_name(tmp_path, short_hash):
    cli = TrainerCLI(ImageClassifier, default_config=default_config(), run=False, args=["--trainer.accelerator=cpu"])
    config = cli.parser.parse_args(["--trainer.accelerator=cpu"])
    run = Run("fit", RunIdentity(""), tmp_path / "runs" / short_hash)
    run.place(config.trainer)
    logger = cli.parser.instantiate(config).trainer.logger
    assert Path(logger.log_dir) == tmp_path / "runs" / short_hash  # not runs/version_727264334204


def test_help_names_the_parts_and_documents_their_options(tmp_path, monkeypatch, capsys):
    help_text = main_output(tmp_path, monkeypatch, capsys, "fit", "--help")
    assert "ENV:   PL_FIT__TRAINER__NUM_NODES" in help_text  # what a launcher may set instead of a file
    text = " ".join(help_text.split())  # unwrapped
    assert "(models/backbones.py: FastCNN, AirBench, CifarResNet; or your own nn.Module)" in text
    assert "torchvision.models" not in text  # not every nn.Module torchvision defines
    assert "(models/schedules.py: OneCycle, Triangle, Constant;" in text  # the CIFAR render's
    part = " ".join(
        main_output(
            tmp_path, monkeypatch, capsys, "fit", "--model.backbone.help", "cifar_classifier.models.backbones.AirBench"
        ).split()
    )
    assert "--model.backbone.width WIDTH Channels of the first group" in part


def hparams_of(run_dir) -> dict:
    """Every value the run's event files give TensorBoard's HPARAMS tab (all sessions' start infos, merged)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    values = {}
    for events_file in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(events_file)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("session_start_info"):
                        for key, entry in data.session_start_info.hparams.items():
                            values[key] = entry.WhichOneof("kind") and getattr(entry, entry.WhichOneof("kind"))
    return values


def test_gradient_accumulation_steps_the_optimizer_once_per_accumulated_batches(tmp_path):
    write_tiny_archive(tmp_path / "data")
    result = run_cli(*fit_args("data", "--trainer.accumulate_grad_batches=2"), cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    batches = (192 - 32) // 16
    assert checkpoint["global_step"] == batches // 2
    # OneCycle ran to its end (lr 0.1 / 25 / 1e4) at the last of the 5 optimizer steps; planned over the 10
    # batches, it would stand near its peak there.
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    lr_at = {event.step: event.value for event in events.Scalars("train/lr")}
    last_step = batches // 2 - 1
    assert max(lr_at) == last_step and lr_at[last_step] < 1e-5 and max(lr_at.values()) == pytest.approx(0.1)
    assert "Batch: 16 per device x 2 accumulated batches = 32 images per optimizer step" in result.stdout
    assert hparams_of(run_dir)["data/images_per_step"] == 32
