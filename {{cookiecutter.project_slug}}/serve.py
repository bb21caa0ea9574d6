"""Serve an exported model over HTTP: POST /predict answers as ``python main.py predict`` does, batched.

python serve.py --model runs/{{ cookiecutter.dataset }}/<hash>/checkpoints/export/ [--port 8000]

It needs no torch and no model code: the export's card and ONNX graph are the whole model (the Dockerfile's
``serve`` stage installs onnxruntime and LitServe alone). ``python serve.py --help`` lists every option;
docs/shipping.md says what a request and an answer look like.
"""

from classifier_engine import run_serve

if __name__ == "__main__":
    run_serve()
