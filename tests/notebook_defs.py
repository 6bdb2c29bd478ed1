"""The tests' name for ``labutils.notebook_source``: the code a lab teaches, taken from its notebook source.

    from notebook_defs import load_definitions
    nb = load_definitions("09_all_to_all_and_sequence_parallel")
"""
from labutils.notebook_source import ROOT, cell_magic_body, load_definitions

__all__ = ["ROOT", "cell_magic_body", "load_definitions"]
