"""Sending functions to the ranks: ``dumps(obj)``, cloudpickle with one fix for torch's config modules.

Functions and classes defined in a notebook cell travel by value (cloudpickle); ``launch`` and the
rank pool both send their payloads with ``dumps``.
"""
from __future__ import annotations

import copyreg
import importlib
import pickle
import sys

import cloudpickle


def dumps(obj) -> bytes:
    """``cloudpickle.dumps(obj)`` that also works for functions using ``dist`` and a global named like one of
    torch's config modules (``config``, ``_config``).

    cloudpickle sends, with a function, every submodule of a global module whose name the code uses as an
    attribute: a function that calls ``dist.get_rank()`` and ``config.rank_device()`` drags
    ``torch.distributed.config`` along. Since torch 2.13 that is a ``ConfigModuleInstance``, which pickle
    cannot copy ("cannot pickle 'ConfigModuleInstance' object"). Such modules are importable by name on
    every rank, so they are sent as a reference instead.
    """
    for mod in list(sys.modules.values()):
        kind = type(mod)
        if kind.__name__ == "ConfigModuleInstance" and kind not in copyreg.dispatch_table:
            copyreg.pickle(kind, _import_by_name)
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _import_by_name(module):
    return importlib.import_module, (module.__name__,)
