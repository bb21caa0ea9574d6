"""Cross-validate: k folds in one command, every figure with its spread, every image's out-of-fold answer.

python cross_validate.py --data.image_dir photos/ [--folds 5] [--fold K] [any main.py fit option]

``python cross_validate.py --help`` lists every option; the summary, the report and the answers go beside
the fold runs (runs/<name>/cv-<first fold's run>/).
"""

from classifier_engine import run_cross_validate

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_cross_validate(ImageClassifier, DEFAULT_CONFIG)
