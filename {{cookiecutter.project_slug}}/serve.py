"""Serve an exported model over HTTP: POST /predict answers as ``python main.py predict`` does, batched.

python serve.py --model runs/{{ cookiecutter.dataset }}/<hash>/checkpoints/export/ [--port 8000]

``python serve.py --help`` lists every option; docs/shipping.md says what a request and an answer look like.
"""

from classifier_engine import run_serve

from {{ cookiecutter.import_name }}.models import ImageClassifier

from main import DEFAULT_CONFIG

if __name__ == "__main__":
    run_serve(ImageClassifier, DEFAULT_CONFIG)
