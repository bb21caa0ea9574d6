import pytest
import torch
import torch.nn.functional as F

from classifier_engine.data.augment import (
    BatchAugment,
    alternating_flip,
    random_crop,
    random_cutout,
    random_flip,
)


def batch(n=16):
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_shapes_and_dtype_are_kept():
    out = BatchAugment(crop_padding=4, flip="random")(batch())
    assert out.shape == (16, 3, 32, 32) and out.dtype == torch.uint8


def test_crop_is_a_window_of_the_zero_padded_image():
    images = batch(8)
    out = random_crop(images, 4, torch.Generator().manual_seed(1))
    padded = F.pad(images, (4, 4, 4, 4))
    for image, cropped in zip(padded, out, strict=True):
        windows = [
            (dy, dx) for dy in range(9) for dx in range(9) if torch.equal(image[:, dy : dy + 32, dx : dx + 32], cropped)
        ]
        assert windows, "every output must be one 32x32 window of the padded input"


def test_reflect_crop_is_a_window_of_the_reflection_padded_image():
    images = batch(8)
    out = random_crop(images, 2, torch.Generator().manual_seed(1), padding_mode="reflect")
    padded = F.pad(images.float(), (2, 2, 2, 2), mode="reflect").to(torch.uint8)
    offsets = set()
    for image, cropped in zip(padded, out, strict=True):
        windows = [
            (dy, dx) for dy in range(5) for dx in range(5) if torch.equal(image[:, dy : dy + 32, dx : dx + 32], cropped)
        ]
        assert windows, "every output must be one 32x32 window of the reflection-padded input"
        offsets.update(windows)
    assert len(offsets) > 1


def test_alternating_flip_shows_each_image_both_ways_over_two_epochs():
    images, ids = batch(64), torch.arange(1000, 1064)
    first, second = (alternating_flip(images, ids, epoch, seed=5) for epoch in (0, 1))
    third = alternating_flip(images, ids, 2, seed=5)
    for image, a, b in zip(images, first, second, strict=True):
        assert {a.flip(-1).tolist() == image.tolist(), b.flip(-1).tolist() == image.tolist()} == {True, False}
    assert torch.equal(first, third)  # the orientation depends on the epoch's parity only
    flipped = sum(not torch.equal(a, i) for a, i in zip(first, images, strict=True))
    assert 16 < flipped < 48  # a fixed pseudo-random half starts mirrored
    assert not torch.equal(first, alternating_flip(images, ids, 0, seed=6))


def test_alternating_flip_needs_image_ids():
    augment = BatchAugment(crop_padding=0, flip="alternating")
    with pytest.raises(ValueError, match="id"):
        augment(batch())


def test_flip_mirrors_some_images_and_keeps_the_rest():
    images = batch(64)
    out = random_flip(images, torch.Generator().manual_seed(2))
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, images, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 10 < sum(flipped) < 54


def test_same_seed_same_augmentation_other_seed_other():
    first, second, other = BatchAugment(), BatchAugment(), BatchAugment()
    first.seed(7)
    second.seed(7)
    other.seed(8)
    images = batch()
    assert torch.equal(first(images), second(images))
    assert not torch.equal(first(images), other(images))


def test_disabled_policy_is_identity():
    images = batch()
    assert torch.equal(BatchAugment(crop_padding=0, flip="none")(images), images)


def test_cutout_zeroes_one_square_per_image():
    images = torch.full((32, 3, 32, 32), 200, dtype=torch.uint8)
    out = random_cutout(images, 8, torch.Generator().manual_seed(3))
    zeroed = (out == 0).all(dim=1)  # (N, H, W): all channels zero
    for mask in zeroed:
        area = int(mask.sum())
        rows, cols = mask.any(dim=1).nonzero(), mask.any(dim=0).nonzero()
        assert 0 < area <= 64 and area == len(rows) * len(cols)  # one (possibly clipped) rectangle
        assert len(rows) <= 8 and len(cols) <= 8
    assert out.dtype == torch.uint8 and (out[out != 0] == 200).all()


@pytest.mark.parametrize(("mixup", "cutmix"), [(0.2, 0.0), (0.0, 1.0), (0.2, 1.0)], ids=["mixup", "cutmix", "both"])
def test_mixing_gives_label_shares_that_match_the_pixels_and_replays_on_resume(mixup, cutmix):
    images, labels = batch(), torch.arange(16) % 4
    augment = BatchAugment(crop_padding=0, flip="none", mixup_alpha=mixup, cutmix_alpha=cutmix, num_classes=4)
    augment.seed(5)
    draws = [augment.mix(augment(images, epoch=1), labels) for _ in range(3)]
    for mixed, shares in draws:
        assert mixed.dtype == torch.float32 and shares.shape == (16, 4)
        assert torch.allclose(shares.sum(dim=1), torch.ones(16))
        # Each image is its own and its neighbour's pixels in its label's shares (torchvision rolls the batch by one).
        own = shares[torch.arange(16), labels]
        neighbour = shares[torch.arange(16), labels.roll(1)]
        assert torch.allclose(own + neighbour, torch.ones(16))
        assert torch.allclose(mixed.mean(dim=(1, 2, 3)), own * images.float().mean(dim=(1, 2, 3))
                              + neighbour * images.roll(1, 0).float().mean(dim=(1, 2, 3)), rtol=0.05)  # fmt: skip
    assert not torch.equal(draws[0][1], draws[1][1])  # a new draw each batch
    resumed = BatchAugment(crop_padding=0, flip="none", mixup_alpha=mixup, cutmix_alpha=cutmix, num_classes=4)
    resumed.seed(5)
    resumed.resume_at(1, 2)  # batches 0 and 1 of epoch 1 were trained before the stop
    mixed, shares = resumed.mix(resumed(images, epoch=1), labels)
    assert torch.equal(mixed, draws[2][0]) and torch.equal(shares, draws[2][1])


def test_no_mixing_leaves_the_labels_as_classes():
    images, labels = batch(), torch.arange(16) % 4
    assert BatchAugment().mix(images, labels) == (images, labels)
    with pytest.raises(ValueError, match="mixup_alpha"):
        BatchAugment(mixup_alpha=-1.0)
