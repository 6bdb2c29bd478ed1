"""Read what distributed ranks leave behind, one parser a module. Lab 05 uses these to debug hangs like a
professional would::

    try:
        labutils.launch(buggy)
    except labutils.RankTimeout as e:
        print(debugging.first_divergence(e.flight))   # which collective the ranks disagree on

    info = debugging.parse_nccl_log(text)             # text printed with env={"NCCL_DEBUG": "INFO"}
    print(debugging.summarize_nccl(info))             # channels, rings, transports (NVLink = P2P)

* ``flight.py``: torch's flight-recorder records (``flight_record`` in a rank, ``read_flight_dumps``,
  ``first_divergence``, ``describe_flight``, ``explain_mismatch``);
* ``nccl_log.py``: ``NCCL_DEBUG=INFO`` logs (``parse_nccl_log`` -> ``NcclLog``, ``summarize_nccl``,
  ``explain_transport``).
"""
from .flight import (describe_flight, explain_mismatch, first_divergence, flight_record, op_name,
                     read_flight_dumps, summarize_flight)
from .nccl_log import (DETAILS, NCCL_LOC_GBPS, TRANSPORTS, Connection, NcclLog, TopoLink, TopoPath,
                       explain_transport, parse_nccl_log, summarize_nccl)

__all__ = ["describe_flight", "explain_mismatch", "first_divergence", "flight_record", "op_name",
           "read_flight_dumps", "summarize_flight", "DETAILS", "NCCL_LOC_GBPS", "TRANSPORTS", "Connection",
           "NcclLog", "TopoLink", "TopoPath", "explain_transport", "parse_nccl_log", "summarize_nccl"]
