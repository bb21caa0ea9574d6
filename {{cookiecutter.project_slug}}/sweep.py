"""Search hyperparameters with Optuna; every trial is an ordinary ``main.py fit`` run.

python sweep.py --sweep configs/sweeps/{{ cookiecutter.dataset }}.yaml [--n_trials N] [fit options ...]

``python sweep.py --help`` lists every option; ``pip install -e ".[sweep]"`` installs what it needs.
"""

from classifier_engine import run_sweep

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_sweep(ImageClassifier, DEFAULT_CONFIG)
