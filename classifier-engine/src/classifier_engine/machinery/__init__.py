"""Kept for one minor release: only ``python -m classifier_engine.machinery.torchrun``, which projects rendered
before 1.6 run from ``scripts/torchrun.sh``. The library lives in rooms by capability (``docs/design.md``)."""
