{% if cookiecutter.dataset == "images" %}import math
{% endif %}from functools import partial

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from classifier_engine import model_guarantees

from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import FastCNN, head_of
from {{ cookiecutter.import_name }}.models.schedules import {% if cookiecutter.dataset == "images" %}WarmupCosine, warmup_cosine{% else %}Triangle, triangle{% endif %}
from {{ cookiecutter.import_name }}.models.test_time import Flip{% if cookiecutter.dataset != "images" %}, FlipTranslate{% endif %}

TINY_FASTCNN = partial(FastCNN, width=4)


def test_fastcnn_maps_images_of_any_size_to_logits():
    for size in (32, 48):
        assert FastCNN(7, width=8).eval()(torch.zeros(2, 3, size, size)).shape == (2, 7)


def test_test_time_augmentation_averages_the_published_views():
    torch.manual_seed(0)
    plain = ImageClassifier(num_classes=10, backbone=TINY_FASTCNN).eval()
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    x = plain.normalize(images)

    def with_mirror(view):
        return 0.5 * plain.backbone(view) + 0.5 * plain.backbone(view.flip(-1))

    with torch.no_grad():
        assert torch.equal(plain.evaluate(images), plain(images))
{%- if cookiecutter.dataset == "images" %}
        for views, expected in [(Flip(), with_mirror(x))]:
{%- else %}
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        shifted = with_mirror(padded[..., :32, :32]) + with_mirror(padded[..., 2:, 2:])
        for views, expected in [(Flip(), with_mirror(x)), (FlipTranslate(), 0.5 * with_mirror(x) + 0.25 * shifted)]:
{%- endif %}
            plain.test_time_augmentation = views
            assert torch.allclose(plain.evaluate(images), expected, atol=1e-5)
            assert torch.equal(plain.evaluate(images, all_views=False), plain(images))


{% if cookiecutter.dataset == "images" -%}
def test_batchnorm_shifts_get_the_scaled_learning_rate_and_the_warmup_cosine_schedule():
    schedule = partial(WarmupCosine, warmup_fraction=0.25)
{%- else -%}
def test_batchnorm_shifts_get_the_scaled_learning_rate_and_the_triangle_schedule():
    schedule = partial(Triangle, warmup_fraction=0.25)
{%- endif %}
    model = ImageClassifier(num_classes=10, backbone=TINY_FASTCNN, norm_bias_lr_scale=64.0, lr_schedule=schedule)
    model.trainer = L.Trainer(accelerator="cpu", max_steps=100, logger=False)  # the schedule spans its 100 steps
    setup = model.configure_optimizers()
    others, shifts = setup["optimizer"].param_groups
    norms = [module.bias for module in model.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    assert {id(p) for p in shifts["params"]} == {id(p) for p in norms}
    assert shifts["weight_decay"] == pytest.approx(others["weight_decay"] / 64)
{%- if cookiecutter.dataset == "images" %}
    assert shifts["lr"] == pytest.approx(others["lr"] * 64) == pytest.approx(0.1 * 64 / 25)  # the first warm-up step
    factor = warmup_cosine(100, 25)
    assert [factor(0), factor(25), factor(100)] == pytest.approx([1 / 25, 1.0, 0.0])
    assert factor(10) == pytest.approx((1 + 10 * 24 / 25) / 25)
    assert factor(60) == pytest.approx(0.5 * (1 + math.cos(math.pi * 35 / 75)))
{%- else %}
    assert shifts["lr"] == pytest.approx(others["lr"] * 64) == pytest.approx(0.1 * 64 * 0.2)
    factor = triangle(100, 25, start=0.2, end=0.07)
    assert [factor(0), factor(25), factor(100)] == pytest.approx([0.2, 1.0, 0.07])
    assert factor(10) == pytest.approx(0.2 + 0.8 * 10 / 25) and factor(60) == pytest.approx(1 - 0.93 * 35 / 75)
{%- endif %}


def test_the_pretrained_body_gets_its_own_learning_rate_and_the_head_the_full_one():
    model = ImageClassifier(num_classes=10, backbone=TINY_FASTCNN, backbone_lr_scale=0.1, norm_bias_lr_scale=4.0)
    model.trainer = L.Trainer(accelerator="cpu", max_steps=100, logger=False)
    groups = {group["name"]: group for group in model.configure_optimizers()["optimizer"].param_groups}
    assert set(groups) == {"body", "body_norm_biases", "head"}
    head = [m for m in model.backbone.modules() if isinstance(m, torch.nn.Linear)][-1].parameters()
    assert {id(p) for p in groups["head"]["params"]} == {id(p) for p in head}
    assert groups["body"]["lr"] == pytest.approx(groups["head"]["lr"] * 0.1)
    assert groups["body_norm_biases"]["lr"] == pytest.approx(groups["head"]["lr"] * 0.4)
    assert groups["body"]["weight_decay"] == groups["head"]["weight_decay"]  # a slower body decays less per step
    assert groups["body_norm_biases"]["weight_decay"] == pytest.approx(groups["head"]["weight_decay"] / 4)
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))


def test_a_training_step_takes_mixed_labels_and_returns_its_logits_for_the_training_totals():
    model = ImageClassifier(num_classes=3, backbone=TINY_FASTCNN)
    images = torch.randint(0, 256, (4, 3, 32, 32)).float()
    shares = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4], [0.2, 0.0, 0.8], [1.0, 0.0, 0.0]])
    step = model.training_step((images, shares), 0)
    logits = model(images)
    assert step["loss"].item() == pytest.approx(F.cross_entropy(logits, shares, label_smoothing=0.1).item(), rel=1e-5)
    assert torch.allclose(step["logits"], logits) and not step["logits"].requires_grad


class RecordedViews(Flip):
    """Flip that notes each time all of its views are spent."""

    def __init__(self, during_fit="final"):
        super().__init__(during_fit)
        self.calls = 0

    def __call__(self, network, images):
        self.calls += 1
        return super().__call__(network, images)


class ViewsPerValidation(L.Callback):
    def __init__(self):
        self.seen = []

    def on_validation_epoch_end(self, trainer, pl_module):
        views = pl_module.test_time_augmentation
        self.seen.append(views.calls)
        views.calls = 0


def tiny_loader(batches=2):
    images = torch.randint(0, 256, (8 * batches, 3, 32, 32), dtype=torch.uint8)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.arange(8 * batches) % 10), 8)


@pytest.mark.parametrize(
    ("during_fit", "limits", "expected"),
    [
        ("final", {"max_epochs": 3}, [0, 0, 1]),  # the epochs' validations see one view; the last one all
        ("final", {"max_epochs": 3, "max_steps": 3}, [0, 1]),  # max_steps inside epoch 1: that validation
        ("every", {"max_epochs": 3}, [1, 1, 1]),
    ],
)
def test_test_time_views_are_spent_where_they_count(during_fit, limits, expected):
    model = ImageClassifier(num_classes=10, backbone=TINY_FASTCNN, test_time_augmentation=RecordedViews(during_fit))
    views = ViewsPerValidation()
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        callbacks=[views, *model_guarantees()],  # as the CLI installs them: a final validation at max_steps
        **limits,
    )
    trainer.fit(model, tiny_loader(), tiny_loader(1))
    assert views.seen == expected
    trainer.test(model, tiny_loader(1), verbose=False)  # evaluation commands always spend all views
    assert model.test_time_augmentation.calls == 1


def test_model_takes_uint8_and_normalizes_inside():
    model = ImageClassifier(num_classes=10, backbone=TINY_FASTCNN, mean=(0.5,) * 3, std=(0.25,) * 3)
    images = torch.full((2, 3, 32, 32), 255, dtype=torch.uint8)
    assert torch.allclose(model.normalize(images), torch.full((2, 3, 32, 32), 2.0))
    assert model(images).shape == (2, 10)


def test_a_training_step_learns():
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone=TINY_FASTCNN, label_smoothing=0.0)
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


@pytest.mark.parametrize(
    ("network", "complaint"),
    [
        (torch.nn.Identity, r"maps a \(1, 3, 32, 32\) image to \(1, 3, 32, 32\)"),
        (torch.nn.Linear, r"Linear\(10\) cannot be built"),
        (torch.nn.Flatten, "cannot classify"),
    ],
)
def test_a_backbone_that_does_not_take_num_classes_first_is_refused_at_construction(network, complaint):
    with pytest.raises(ValueError, match=complaint) as refused:
        ImageClassifier(num_classes=10, backbone=network)
    assert "model.backbone must be a class taking num_classes first" in str(refused.value)


def test_features_are_what_the_classifier_head_takes():
    model = ImageClassifier(num_classes=3, backbone=TINY_FASTCNN).eval()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        features, logits = model.features(images), model(images)
        assert features.shape == (4, head_of(model.backbone).in_features)
        assert torch.allclose(head_of(model.backbone)(features), logits, atol=1e-5)
