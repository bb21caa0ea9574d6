"""Benchmarks of the project in the current folder, each printing its ratio against a baseline run beside it.

``python -m classifier_engine.bench NAME [options]`` from a project's folder (or with ``BENCH_PROJECT``
naming it): ``data``, ``folder``, ``stream``, ``step``, ``recipe``, ``finetune``, ``infer``, ``layout``, or
``gpu_figures`` (every GPU figure in one go). ``--help`` after a name lists its options.
"""
