"""Find the training images whose labels look wrong: k-fold out-of-sample probabilities, ranked by cleanlab.

python check_labels.py{% if cookiecutter.dataset == "images" %} --data.image_dir photos/{% endif %} [--folds 5] [any main.py fit option]

``python check_labels.py --help`` lists every option; ``pip install -e ".[labels]"`` installs what it needs.
"""

from classifier_engine import run_check_labels

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_check_labels(ImageClassifier, DEFAULT_CONFIG)
