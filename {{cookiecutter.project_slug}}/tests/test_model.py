from types import SimpleNamespace
from typing import get_args

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from {{ cookiecutter.import_name }}.data import CifarDataModule, TrainingImages
from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import (
    BackboneName,
    IdentityInitConv,
    PatchWhitening,
    build_backbone,
)
from {{ cookiecutter.import_name }}.models.schedules import triangle


@pytest.mark.parametrize("name", get_args(BackboneName))
def test_every_backbone_maps_images_to_logits(name):
    net = build_backbone(name, num_classes=7, width=8 if name in ("fastcnn", "airbench") else 64)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


def smooth_images(count=64):
    """Images whose neighbouring pixels are strongly correlated, as in real photographs."""
    coarse = torch.randn(count, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    return F.interpolate(coarse, size=32, mode="bilinear", align_corners=False)


def test_whitening_layer_decorrelates_the_patches_it_was_fitted_to():
    layer = PatchWhitening(eps=1e-6)
    images = smooth_images()
    layer.fit(images)
    weight = layer.weight.detach()
    assert not layer.weight.requires_grad and torch.equal(weight[12:], -weight[:12])
    responses = F.conv2d(images.double(), weight[:12].double())  # (N, 12, 31, 31), no bias
    flat = responses.permute(0, 2, 3, 1).reshape(-1, 12)
    covariance = flat.T @ flat / len(flat)
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=1e-3)


def test_identity_initialized_convolutions_pass_their_input_through():
    x = torch.randn(2, 4, 8, 8)
    assert torch.allclose(IdentityInitConv(4, 6)(x)[:, :4], x, atol=1e-6)


def test_test_time_augmentation_averages_the_published_views():
    torch.manual_seed(0)
    plain = ImageClassifier(num_classes=10, backbone="fastcnn", width=4).eval()
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    x = plain.normalize(images)

    def with_mirror(view):
        return 0.5 * plain.backbone(view) + 0.5 * plain.backbone(view.flip(-1))

    with torch.no_grad():
        assert torch.equal(plain.evaluate(images), plain(images))
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        shifted = with_mirror(padded[..., :32, :32]) + with_mirror(padded[..., 2:, 2:])
        for mode, expected in [("flip", with_mirror(x)), ("flip_translate", 0.5 * with_mirror(x) + 0.25 * shifted)]:
            plain.hparams.test_time_augmentation = mode
            assert torch.allclose(plain.evaluate(images), expected, atol=1e-5)


def test_channels_last_changes_the_memory_order_not_the_result():
    torch.manual_seed(0)
    standard = ImageClassifier(num_classes=10, backbone="airbench", width=4).eval()
    nhwc = ImageClassifier(num_classes=10, backbone="airbench", width=4, channels_last=True).eval()
    nhwc.load_state_dict(standard.state_dict())
    conv = nhwc.backbone[2][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.allclose(nhwc(images), standard(images), atol=1e-5)


def test_batchnorm_shifts_get_the_scaled_learning_rate_and_the_triangle_schedule():
    model = ImageClassifier(
        num_classes=10, backbone="airbench", width=4, norm_bias_lr_scale=64.0, lr_schedule="triangle",
        warmup_fraction=0.25,
    )  # fmt: skip
    model._trainer = SimpleNamespace(estimated_stepping_batches=100)
    setup = model.configure_optimizers()
    others, shifts = setup["optimizer"].param_groups
    assert len(shifts["params"]) == 6 and all(p.ndim == 1 for p in shifts["params"])
    assert shifts["lr"] == pytest.approx(others["lr"] * 64) == pytest.approx(0.1 * 64 * 0.2)
    assert shifts["weight_decay"] == pytest.approx(others["weight_decay"] / 64)
    factor = triangle(100, 25, start=0.2, end=0.07)
    assert [factor(0), factor(25), factor(100)] == pytest.approx([0.2, 1.0, 0.07])
    assert factor(10) == pytest.approx(0.2 + 0.8 * 10 / 25) and factor(60) == pytest.approx(1 - 0.93 * 35 / 75)


@pytest.mark.parametrize(
    ("fn", "step", "epoch", "tta_validations", "views"),
    [
        ("fit", 3, 0, "final", "none"),  # an epoch's validation: one view, cheap
        ("fit", 10, 1, "final", "flip_translate"),  # the last one (max_steps reached): all views
        ("fit", 8, 2, "final", "flip_translate"),  # the last epoch
        ("fit", 3, 0, "every", "flip_translate"),
        ("test", 3, 0, "final", "flip_translate"),  # evaluation commands: always all views
    ],
)
def test_test_time_views_are_spent_where_they_count(fn, step, epoch, tta_validations, views):
    views_at = {"test_time_augmentation": "flip_translate", "tta_validations": tta_validations}
    model = ImageClassifier(num_classes=10, backbone="fastcnn", width=4, **views_at)
    model._trainer = SimpleNamespace(
        state=SimpleNamespace(fn=fn), max_steps=10, global_step=step, max_epochs=3, current_epoch=epoch
    )
    assert model._evaluation_views() == views


def test_whitening_bias_starts_at_zero_as_in_airbench():
    model = ImageClassifier(num_classes=10, backbone="airbench", width=4)
    assert torch.count_nonzero(model.backbone[0].bias) == 0


def test_whitening_bias_trains_only_for_its_first_epochs():
    model = ImageClassifier(num_classes=10, backbone="airbench", width=4, whitening_bias_epochs=2)
    bias = model.backbone[0].bias
    for epoch, trains in [(0, True), (1, True), (2, False)]:
        model._trainer = SimpleNamespace(current_epoch=epoch)
        bias.grad = torch.ones_like(bias)
        model.on_before_optimizer_step(None)
        assert (bias.grad is not None) == trains


def test_resnet_refuses_a_width_it_cannot_have():
    with pytest.raises(ValueError, match="fixed base width"):
        build_backbone("resnet18", num_classes=10, width=8)


def test_model_takes_uint8_and_normalizes_inside():
    model = ImageClassifier(num_classes=10, backbone="fastcnn", width=4, mean=(0.5,) * 3, std=(0.25,) * 3)
    images = torch.full((2, 3, 32, 32), 255, dtype=torch.uint8)
    assert torch.allclose(model.normalize(images), torch.full((2, 3, 32, 32), 2.0))
    assert model(images).shape == (2, 10)


def test_a_training_step_learns():
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone="fastcnn", width=4, label_smoothing=0.0)
    images = torch.cat([torch.zeros(8, 3, 32, 32), torch.full((8, 3, 32, 32), 255.0)]).to(torch.uint8)
    labels = torch.tensor([0] * 8 + [1] * 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(15):
        loss = model.criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_class_names_must_match_num_classes():
    with pytest.raises(ValueError, match="3 class names given for 10 classes"):
        ImageClassifier(num_classes=10, class_names=["a", "b", "c"])


def test_data_fitted_layers_ask_for_training_images_by_a_named_interface():
    assert isinstance(CifarDataModule(), TrainingImages)
    assert not isinstance(L.LightningDataModule(), TrainingImages)
    model = ImageClassifier(num_classes=10, backbone="airbench", width=4)
    model._trainer = SimpleNamespace(datamodule=L.LightningDataModule())
    with pytest.raises(ValueError, match="TrainingImages"):
        model._fit_whitening()
