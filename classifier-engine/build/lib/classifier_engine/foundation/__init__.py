"""The ground every wing stands on: one-line errors, files that are complete or absent, copies made once.

It imports nothing of the project; the data, the models, the callbacks and the machinery import it.
"""
