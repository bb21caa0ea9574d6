"""Test-time augmentation: logits averaged over several views of each image.

``model.test_time_augmentation`` names one of these by ``class_path`` (or class name). The
model calls it with its network and a batch of normalized images at validation, test and
predict; ``during_fit`` says which validations during ``fit`` pay for the extra views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import lightning as L
{% if cookiecutter.dataset != "images" %}import torch
import torch.nn.functional as F
{% endif %}from torch import Tensor

from classifier_engine import check_choice

Network = Callable[[Tensor], Tensor]
DuringFit = Literal["final", "every"]


class TestTimeAugmentation:
    """Base class: one view (the image itself); subclasses average more."""

    __test__ = False  # a library class, not a pytest test class

    def __init__(self, during_fit: DuringFit = "final") -> None:
        """Choose where the views are spent.

        Args:
            during_fit: Which validations during fit average the views: final (the last one; the others
                see one view, which is cheaper) or every one. validate/test/predict always do.
        """
        check_choice("model.test_time_augmentation.during_fit", during_fit, DuringFit)
        self.during_fit = during_fit

    def __call__(self, network: Network, images: Tensor) -> Tensor:
        return network(images)

    def all_views_now(self, trainer: L.Trainer) -> bool:
        """False at a validation during fit that is not the last (unless ``during_fit`` is every)."""
        if self.during_fit == "every" or trainer.state.fn != "fit":
            return True
        last_step = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        return last_step or (trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs - 1)


class Flip(TestTimeAugmentation):
    """The image and its mirror image (two views)."""

    def __call__(self, network: Network, images: Tensor) -> Tensor:
        return 0.5 * network(images) + 0.5 * network(images.flip(-1))
{% if cookiecutter.dataset != "images" %}

class FlipTranslate(Flip):
    """airbench94's six views: the mirror pair, weighted 1/2, and the pairs shifted one pixel up-left and down-right."""

    def __call__(self, network: Network, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        padded = F.pad(images, (1, 1, 1, 1), mode="reflect")
        shifted = (padded[..., :height, :width], padded[..., 2:, 2:])
        mirrored = super().__call__
        shifted_logits = torch.stack([mirrored(network, view) for view in shifted]).mean(0)
        return 0.5 * mirrored(network, images) + 0.5 * shifted_logits
{% endif %}