"""fastai's recipe for a small folder, as fastbook teaches it: what users pick instead, for ``bench finetune``.

    python fastai_finetune.py --train_dir photos/train --val_dir photos/val [--network NAME]
        [--weights_path FILE] [--epochs 5] [--seed 0]

Run with the Python of an environment where fastai is installed (``pip install fastai``): it is not a
dependency of the project. ``vision_learner`` on the same timm weights (fastai's own head: concat pooling,
BatchNorm, dropout, two linear layers), ``Resize(460)`` then ``aug_transforms(size, min_scale=0.75)``, and
``fine_tune(epochs - 1, freeze_epochs=1)``: one epoch with the body frozen, then the rest with one-cycle
and discriminative rates. Its last line is ``{"val_top1": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path


def main() -> None:
    from fastai.vision.all import ImageDataLoaders, Resize, accuracy, aug_transforms, set_seed, vision_learner

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_dir", type=Path, required=True, help="class folders of training photos")
    parser.add_argument("--val_dir", type=Path, required=True, help="class folders of validation photos")
    parser.add_argument("--network", default="tf_efficientnet_lite1.in1k", help="a timm name with its weights' tag")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of that network (offline)")
    parser.add_argument("--pretrained", type=int, default=1, help="0: random weights (a quick check only)")
    parser.add_argument("--image_size", type=int, default=240, help="the side the network sees")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    set_seed(args.seed, reproducible=True)
    with tempfile.TemporaryDirectory(prefix="fastai-") as folder:
        root = Path(folder)  # fastai reads train/ and valid/ beside each other
        shutil.copytree(args.train_dir, root / "train")
        shutil.copytree(args.val_dir, root / "valid")
        data = ImageDataLoaders.from_folder(
            root,
            train="train",
            valid="valid",
            item_tfms=Resize(460),
            bs=args.batch_size,
            seed=args.seed,
            batch_tfms=aug_transforms(size=args.image_size, min_scale=0.75),
            num_workers=args.workers,
        )
        options = {"pretrained_cfg_overlay": {"file": str(args.weights_path)}} if args.weights_path else {}
        learner = vision_learner(data, args.network, pretrained=bool(args.pretrained), metrics=accuracy, **options)
        learner.fine_tune(max(1, args.epochs - 1), freeze_epochs=1)
        top1 = float(learner.validate()[1])
    print(json.dumps({"val_top1": [top1]}))


if __name__ == "__main__":
    main()
