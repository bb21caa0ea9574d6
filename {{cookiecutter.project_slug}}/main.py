"""Train, validate, test or predict: ``python main.py fit --config configs/{{ cookiecutter.dataset }}.yaml``.

Every subcommand starts from ``configs/{{ cookiecutter.dataset }}.yaml``; ``--config`` files and options go on top.
The model is this project's ``ImageClassifier``; the command line is classifier_engine's LightningCLI.
"""

from pathlib import Path

from classifier_engine import run_main

from {{ cookiecutter.import_name }}.models import ImageClassifier

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "{{ cookiecutter.dataset }}.yaml"

if __name__ == "__main__":  # guarded so that spawned DDP workers can import this file
    run_main(ImageClassifier, DEFAULT_CONFIG)
