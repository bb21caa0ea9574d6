"""Cross-validate: k folds in one command, every figure with its spread, every image's out-of-fold answer,
then the model to ship.

python cross_validate.py{% if cookiecutter.dataset == "images" %} --data.image_dir photos/{% endif %} [--folds 5] [--fold K] [--final all|ensemble|none]
    [any main.py fit option]

``python cross_validate.py --help`` lists every option; the summary, the report and the answers go beside
the fold runs (runs/<name>/cv-<first fold's run>/); the final model, trained on every image, is a run of its
own (checkpoints/final.ckpt, exported to checkpoints/export/).
"""

from classifier_engine import run_cross_validate

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_cross_validate(ImageClassifier, DEFAULT_CONFIG)
