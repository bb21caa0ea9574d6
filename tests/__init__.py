"""Tests of the template: renders, refused answers, and rendered projects installed and run."""
