"""The fast CIFAR recipe's parts: airbench94's network (whitening, identity init), its lookahead, and the ResNet."""

from functools import partial
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from classifier_engine import TrainingImages, UsageError

from {{ cookiecutter.import_name }}.callbacks import Lookahead, WhiteningFit
from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import (
    AirBench,
    CifarResNet,
    IdentityInitConv,
    PatchWhitening,
)

TINY_AIRBENCH = partial(AirBench, width=4)


NETWORKS = [partial(AirBench, width=8), *(partial(CifarResNet, depth=d) for d in (18, 34, 50))]


@pytest.mark.parametrize("backbone", NETWORKS, ids=["airbench", "resnet18", "resnet34", "resnet50"])
def test_every_cifar_network_maps_images_to_logits(backbone):
    net = backbone(7).eval()  # eval: airbench's whitening layer is fitted at fit start, before any training step
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


def test_channels_last_changes_the_memory_order_not_the_result():
    torch.manual_seed(0)
    standard = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH).eval()
    nhwc = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH, channels_last=True).eval()
    nhwc.load_state_dict(standard.state_dict())
    conv = nhwc.backbone[2][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.allclose(nhwc(images), standard(images), atol=1e-5)


def test_whitening_bias_starts_at_zero_as_in_airbench():
    model = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH)
    assert torch.count_nonzero(model.backbone[0].bias) == 0


def whitened_model_and_fit(bias_epochs=3):
    model = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH)
    images = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8)
    data = SimpleNamespace(train_images=lambda count: images[:count])
    fit = WhiteningFit(images=30, bias_epochs=bias_epochs)
    fit.setup(SimpleNamespace(datamodule=data), model, "fit")
    return model, fit, images


def test_whitening_fit_fits_the_layer_to_the_first_training_images():
    model, _, images = whitened_model_and_fit()
    expected = PatchWhitening()
    expected.fit(model.normalize(images[:30]))
    assert torch.equal(model.backbone[0].weight, expected.weight) and model.backbone[0].fitted


def test_whitening_bias_trains_only_for_its_first_epochs():
    model, fit, _ = whitened_model_and_fit(bias_epochs=2)
    bias = model.backbone[0].bias
    for epoch, trains in [(0, True), (1, True), (2, False)]:
        bias.grad = torch.ones_like(bias)
        fit.on_before_optimizer_step(SimpleNamespace(current_epoch=epoch), model, None)
        assert (bias.grad is not None) == trains


def test_an_unfitted_whitening_layer_refuses_to_train_and_names_the_callback():
    model = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH)
    with pytest.raises(UsageError, match=r"callbacks\.WhiteningFit"):
        model(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
    model.eval()(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))  # evaluating a fresh model is allowed
    fitted = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH)
    fitted.load_state_dict(whitened_model_and_fit()[0].state_dict())  # a checkpoint's weights are fitted ones
    assert fitted.backbone[0].fitted


def test_resnet_depth_picks_torchvision_layout():
    blocks = {depth: len(CifarResNet(10, depth).layer3) for depth in (18, 34, 50)}
    assert blocks == {18: 2, 34: 6, 50: 6} and isinstance(CifarResNet(10, 50).layer1[0].conv3, torch.nn.Conv2d)
    with pytest.raises(ValueError, match="18, 34 or 50"):
        CifarResNet(10, depth=20)


def test_data_fitted_layers_ask_for_training_images_by_a_named_interface(project_data):
    assert isinstance(project_data, TrainingImages)
    assert not isinstance(L.LightningDataModule(), TrainingImages)
    model = ImageClassifier(num_classes=10, backbone=TINY_AIRBENCH)
    with pytest.raises(ValueError, match="TrainingImages"):
        WhiteningFit().setup(SimpleNamespace(datamodule=L.LightningDataModule()), model, "fit")


def test_lookahead_pulls_weights_to_the_slow_copy_on_its_schedule():
    net = torch.nn.Linear(3, 2)
    lookahead = Lookahead(every_n_steps=5, decay=0.9, power=2.0)
    fit = SimpleNamespace(estimated_stepping_batches=20)  # the steps of the fit, read at its start
    lookahead.on_train_start(fit, net)
    start = net.weight.detach().clone()

    def step_to(step):
        with torch.no_grad():
            net.weight.add_(1.0)
        lookahead.on_train_batch_end(SimpleNamespace(global_step=step), net, None, None, 0)

    step_to(4)  # not a multiple of 5: untouched
    assert torch.allclose(net.weight, start + 1)
    step_to(5)  # pull by 1 - 0.9**5 * (5/20)**2: the slow copy moves almost all the way
    decay = 0.9**5 * 0.25**2
    expected = start + (1 - decay) * 2
    assert torch.allclose(net.weight, expected) and torch.allclose(lookahead.slow["weight"], expected)
    slow = lookahead.slow["weight"].clone()
    step_to(20)  # the last step: a regular pull, then the weights become the slow copy
    decay = 0.9**5
    assert torch.allclose(net.weight, slow + (1 - decay) * (slow + 1 - slow))
    restored = Lookahead()
    restored.load_state_dict(lookahead.state_dict())
    restored.on_train_start(fit, net)
    assert torch.equal(restored.slow["weight"], lookahead.slow["weight"])
