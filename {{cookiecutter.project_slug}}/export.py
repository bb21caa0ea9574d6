"""Turn a checkpoint into deployable files (ONNX, int8, torch.export), each checked and judged, with a model card.

python export.py --ckpt_path runs/{{ cookiecutter.dataset }}/<hash>/checkpoints/last.ckpt [--register NAME]

``python export.py --help`` lists every option.
"""

from classifier_engine.commands import export

from {{ cookiecutter.import_name }}.models import ImageClassifier

EXPERIMENT = "{{ cookiecutter.project_slug }}"  # MLflow's experiment for an export whose training was not tracked

if __name__ == "__main__":
    export.run(ImageClassifier, EXPERIMENT)
