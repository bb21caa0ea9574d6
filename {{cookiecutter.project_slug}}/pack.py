"""Pack your images into a litdata dataset in object storage or a folder, to stream to every rank of ``fit``.

python pack.py --data.image_dir photos/ --data.image_size 128 --output s3://bucket/photos-128
python main.py fit --config configs/images.yaml --config configs/presets/streaming.yaml --data.source s3://bucket/photos-128

Takes the ``--data.*`` options of ``fit`` on your own images (image_size, resize, val_fraction, ...).
Run it on one machine, or as every rank of a torchrun, SLURM or Kubeflow job: each packs a share.
"""

from classifier_engine.machinery.pack_command import main

if __name__ == "__main__":
    main()
