"""Train, validate, test or predict: ``python main.py fit --config configs/{{ cookiecutter.dataset }}.yaml``."""

from {{ cookiecutter.import_name }}.cli import TrainerCLI

if __name__ == "__main__":  # guarded so that spawned DDP workers can import this file
    TrainerCLI()
