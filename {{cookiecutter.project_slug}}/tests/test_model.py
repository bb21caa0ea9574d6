import pytest
import torch

from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import build_backbone


@pytest.mark.parametrize("name", ["fastcnn", "resnet18", "resnet34", "resnet50"])
def test_every_backbone_maps_images_to_logits(name):
    net = build_backbone(name, num_classes=7, width=8 if name == "fastcnn" else 64)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


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
