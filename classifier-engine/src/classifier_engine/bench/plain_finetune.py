"""The fine-tune a user writes by hand, outside this project: timm + torchvision ``ImageFolder`` + ``DataLoader``.

    python -m classifier_engine.bench.plain_finetune --train_dir photos/train --val_dir photos/val [--network NAME]
        [--weights_path FILE] [--epochs 5] [--batch_size 32] [--lr 0.001] [--seed 0]

PyTorch's transfer-learning tutorial with a timm network: the weights' own transforms
(``timm.data.create_transform``: random-resized crop and flip for training, resize and centre crop
for evaluation), every layer trained from the first step with SGD (momentum 0.9) at a constant
rate, plain cross-entropy, the last weights evaluated on one view. ``bench_finetune.py`` runs it
as its third arm; it imports nothing of this project. Its last line is one JSON object: the
validation top-1 after each epoch and the mean seconds an epoch took (training and validation).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import timm
import torch
from torch import nn
from torchvision import datasets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_dir", type=Path, required=True, help="class folders of training photos")
    parser.add_argument("--val_dir", type=Path, required=True, help="class folders of validation photos")
    parser.add_argument("--network", default="tf_efficientnet_lite1.in1k", help="a timm name with its weights' tag")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of that network (offline)")
    parser.add_argument("--pretrained", type=int, default=1, help="0: random weights (a quick check only)")
    parser.add_argument("--image_size", type=int, help="the side the network sees; default: the weights' own")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    classes = sorted(folder.name for folder in args.train_dir.iterdir() if folder.is_dir())
    overlay = {"file": str(args.weights_path)} if args.weights_path else None
    model = timm.create_model(
        args.network, pretrained=bool(args.pretrained), num_classes=len(classes), pretrained_cfg_overlay=overlay
    )
    config = timm.data.resolve_model_data_config(model)
    if args.image_size:
        config["input_size"] = (3, args.image_size, args.image_size)
    train = datasets.ImageFolder(args.train_dir, timm.data.create_transform(**config, is_training=True, hflip=0.5))
    val = datasets.ImageFolder(args.val_dir, timm.data.create_transform(**config))
    generator = torch.Generator().manual_seed(args.seed)
    train_loader = torch.utils.data.DataLoader(
        train, args.batch_size, shuffle=True, num_workers=args.workers, generator=generator
    )
    val_loader = torch.utils.data.DataLoader(val, 64, num_workers=args.workers)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_function = nn.CrossEntropyLoss()
    tops, seconds = [], []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss_function(model(images), labels).backward()
            optimizer.step()
        model.eval()
        right = 0
        with torch.no_grad():
            for images, labels in val_loader:
                right += (model(images).argmax(dim=1) == labels).sum().item()
        seconds.append(time.perf_counter() - start)
        tops.append(right / len(val))
        print(f"epoch {epoch}: val top-1 {tops[-1]:.4f} ({seconds[-1]:.1f} s)", flush=True)
    print(json.dumps({"val_top1": tops, "seconds_per_epoch": sum(seconds) / len(seconds)}))


if __name__ == "__main__":
    main()
