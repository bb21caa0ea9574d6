"""Tests of the data path, the model and the command line."""
