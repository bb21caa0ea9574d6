"""Turn a checkpoint into deployable files (ONNX, int8, torch.export), each checked and judged, with a model card.

python export.py --ckpt_path runs/{{ cookiecutter.dataset }}/<hash>/checkpoints/last.ckpt [--register NAME]

``python export.py --help`` lists every option.
"""

from classifier_engine import run_export

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_export(ImageClassifier, DEFAULT_CONFIG)
