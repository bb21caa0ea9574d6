"""The ground every wing stands on: one-line errors, files that are complete or absent, copies made once.

It imports nothing of the library or a project; every other room imports it.
"""
