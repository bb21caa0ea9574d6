"""Pack your images into a litdata dataset in object storage or a folder, to stream to every rank of ``fit``.

python pack.py --data.image_dir photos/ --data.image_size 128 --output s3://bucket/photos-128
python main.py fit --config configs/images.yaml --config configs/presets/streaming.yaml --data.source s3://bucket/photos-128

It reads the configs as ``fit`` does (``configs/images.yaml``, then any ``--config`` and ``--data.*`` options)
and packs through this project's DataModule, so the packed images are the ones ``fit`` would train on: same
split, size and resize rule. Run it on one machine, or as every rank of a torchrun, SLURM or Kubeflow job:
each packs a share.
"""

from classifier_engine import run_pack

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_pack(ImageClassifier, DEFAULT_CONFIG)
