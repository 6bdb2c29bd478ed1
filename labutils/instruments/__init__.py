"""Measuring instruments that every lab shares, below the labs and above the core.

* ``ledger`` -- ``Ledger``: the communication a rank issues (collectives and point-to-point), with
  each call's size and the bytes it puts on the wire.

Import the module you need (``from labutils.instruments.ledger import Ledger``); this package
re-exports nothing, so each name has one home.
"""
