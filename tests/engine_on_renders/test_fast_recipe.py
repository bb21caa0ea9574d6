"""The airbench recipe (configs/cifar10_fast.yaml) through the CLI, with every speed switch on."""

import pytest
import torch
from cifar_classifier.data import CifarDataModule
from cifar_classifier.models import ImageClassifier
from cifar_classifier.models.backbones import AirBench, PatchWhitening
from cifar_classifier.models.test_time import FlipTranslate
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.export.evaluation import (
    measure_parity,
    onnx_predictor,
    torch_predictor,
)
from classifier_engine.export.model_loading import load_model
from classifier_engine.export.onnx_export import export_onnx

from .conftest import PROJECT_ROOT, default_config, only_run_dir, run_cli, write_tiny_archive

FAST_CONFIG = PROJECT_ROOT / "configs" / "cifar10_fast.yaml"


@pytest.mark.slow  # a CIFAR-10 recipe whatever the project's default dataset: one run is enough
def test_fast_recipe_trains_evaluates_with_tta_and_exports(tmp_path):
    write_tiny_archive(tmp_path / "data", CIFAR10)
    run_cli(
        "fit", "--config", str(default_config()), "--config", str(FAST_CONFIG), "--data.data_dir=data",
        "--data.verify_checksum=false",
        "--data.global_batch_size=32", "--data.storage=device", "--model.backbone.width=4",
        "--trainer.max_steps=9", "--trainer.log_every_n_steps=1", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        # Kernel generation (inductor) takes about a minute on a CPU; this backend traces the same graphs.
        "--model.compile=true", "--model.compile_backend=aot_eager", "--model.compile_mode=null",
        cwd=tmp_path,
    )  # fmt: skip
    run_dir = only_run_dir(tmp_path)
    assert run_dir.parent.name == "cifar10_fast"
    loaded = load_model(run_dir / "checkpoints" / "last.ckpt", ImageClassifier, default_config(),
                        ["--config", str(run_dir / "config.yaml")])  # fmt: skip
    model, checkpoint = loaded.model, loaded.checkpoint
    assert checkpoint["global_step"] == 9 and checkpoint["epoch"] == 1  # 192 images / 32 = 6 steps per epoch
    assert isinstance(model.backbone, AirBench) and isinstance(model.test_time_augmentation, FlipTranslate)

    # The whitening filters are the ones WhiteningFit fitted to the training images, untouched by training.
    data = CifarDataModule(data_dir=str(tmp_path / "data"), verify_checksum=False, val_size=0, batch_size=32)
    data.setup("fit")
    expected = PatchWhitening()
    expected.fit(model.normalize(data.train_images(5000)))  # the config's count; all 192 of them here
    assert torch.allclose(model.backbone[0].weight, expected.weight, atol=1e-6)

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"val/top1", "train/loss_step", "train/lr/main", "train/lr/norm_biases"} <= scalars
    lrs = [event.value for event in events.Scalars("train/lr/main")]
    biases = [event.value for event in events.Scalars("train/lr/norm_biases")]
    assert lrs[0] < max(lrs) and lrs[-1] < max(lrs)  # the triangle: up, then down
    assert biases[0] == pytest.approx(64 * lrs[0])

    output = tmp_path / "fast.onnx"
    export_onnx(model, output)
    assert measure_parity(torch_predictor(model), onnx_predictor(output), tolerance=1e-4).ok
