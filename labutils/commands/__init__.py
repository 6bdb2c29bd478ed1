"""The verbs of ``python -m labutils``, one module each, with ``add_arguments(parser)`` and
``run(args) -> exit status``: ``hw``, ``run_labs`` (``run-labs``), ``bench``, ``workspace``."""
