"""Lab 05's verdicts, each from a recording through a written rule (see ``labutils.claims``).

``CLAIMS`` maps recording names to functions of their ``data`` dicts; the notebook prints their lines
and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/05_*.json``. The rules judge
outcomes, not speeds: did the launch end in an error, a hang or values; did the process die by the
watchdog; does the flight recorder name a collective; which transport and path NCCL chose.
"""
from __future__ import annotations

from ... import claims, debugging
from . import topology


def outcome_kind(outcome: str) -> str:
    """``"hang: ranks [1] did not finish ..."`` -> ``"hang"`` (also ``"error"``, ``"wrong values"``)."""
    return outcome.split(":", 1)[0].strip()


def mistake_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_raw_mistakes_nccl``: a collective mismatch under NCCL, without any debug setting."""
    out = []
    for which, claim in (("order", "NCCL reports collectives called in a different order on different ranks"),
                         ("shapes", "NCCL reports an all_reduce whose shapes differ across ranks")):
        o = data[which]
        kind = outcome_kind(o["outcome"])
        out.append(claims.Verdict(claim, o["outcome"][:100],
                                  "TRUE if a rank raises an error; FALSE if the ranks hang or return values",
                                  claims.TRUE if kind == "error" else claims.FALSE))
    return out


def wrong_device_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_wrong_device_nccl``: the source's CPU tensors under ``backend='nccl'``."""
    message = data["message"]
    return [claims.Verdict("Source 002: torch.randn(1000, 1000) (a CPU tensor) works with backend='nccl'",
                           message[:120], "TRUE if the collective returns ('ok')",
                           claims.TRUE if message == "ok" else claims.FALSE)]


def timeout_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_torch_timeout_nccl``: torch's own process-group timeout under NCCL."""
    error = data["error"]
    aborted = "SIGABRT" in error or "Watchdog caught collective operation timeout" in error
    head = error.split(". HINT")[0][:110]
    return [
        claims.Verdict("torch's process-group timeout ends an NCCL hang: the watchdog aborts the waiting process",
                       f"after {data['seconds']} s: {head}",
                       "TRUE if the rank died by SIGABRT or with the watchdog's timeout message",
                       claims.TRUE if aborted else claims.FALSE),
        claims.Verdict("The flight-recorder dumps written on the timeout name the collective the ranks disagree on",
                       data["divergence"], "TRUE if first_divergence names a collective ('collective #n: ...')",
                       claims.TRUE if data["divergence"].startswith("collective #") else claims.FALSE),
    ]


def nccl_log_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_nccl_debug_info``: the transport NCCL chose, and the path its topology graph has."""
    log = debugging.parse_nccl_log(data["log"])
    transports = log.transports
    paths = topology.gpu_paths(log)
    via_nvswitch = any(link.dst.startswith("NVS/") for link in log.topology)
    return [
        claims.Verdict("NCCL connects the GPUs directly (P2P), not through host memory (SHM) or the network (NET)",
                       ", ".join(f"{n} x {t}" for t, n in transports.items()) or "no connection lines",
                       "TRUE if every channel connection is P2P",
                       claims.TRUE if transports and all(t.startswith("P2P") for t in transports) else claims.FALSE),
        claims.Verdict("NCCL's topology graph joins the GPUs by NVLink through an NVSwitch",
                       topology.describe_path(paths[0], log) if paths else "no GPU-to-GPU path lines",
                       "TRUE if every GPU-to-GPU path is NVL and the GPUs' NVLinks end at an NVS node",
                       claims.TRUE if paths and via_nvswitch and all(p.type == "NVL" for p in paths) else claims.FALSE),
    ]


CLAIMS = {"05_raw_mistakes_nccl": mistake_verdicts, "05_wrong_device_nccl": wrong_device_verdicts,
          "05_torch_timeout_nccl": timeout_verdicts, "05_nccl_debug_info": nccl_log_verdicts}


# ---- one GPU: NCCL_DEBUG=INFO of a one-rank communicator, and two ranks on one GPU ---------------------------

DUPLICATE_GPU = "Duplicate GPU detected"   # NCCL's words (src/init.cc) when two ranks of a communicator share a GPU


def one_rank_log_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_nccl_one_rank``: one NCCL rank on this machine's first GPU, with ``NCCL_DEBUG=INFO``."""
    log = debugging.parse_nccl_log(data["log"])
    results = data.get("results") or []
    return [
        claims.Verdict("with one rank NCCL builds a communicator that connects to no other GPU",
                       f"NCCL {log.version or '?'}: {log.nranks or '?'} rank(s), {len(log.connections)} channel "
                       "connection lines", "TRUE if the log has 1 rank and no connection line",
                       claims.TRUE if log.nranks == 1 and not log.connections else claims.FALSE),
        claims.Verdict("a one-rank all_reduce and broadcast return the rank's own data", f"results {results}",
                       "TRUE if the launch ended without an error and returned 1.0",
                       claims.TRUE if results == [1.0] and not data.get("error") else claims.FALSE),
    ]


def two_ranks_one_gpu_verdicts(data: dict) -> list[claims.Verdict]:
    """``05_two_ranks_one_gpu``: two ranks that both bind to GPU 0 and create one NCCL communicator."""
    said = data["message"] + "\n" + "\n".join(data["nccl_warn"])
    return [
        claims.Verdict("two ranks on one GPU end in an error, not in a hang or a result",
                       f"{data['outcome']} after {data['seconds']:.1f} s", "TRUE if a rank raised an error",
                       claims.TRUE if data["outcome"] == "error" else claims.FALSE),
        claims.Verdict("NCCL names the mistake", next((ln.strip()[:160] for ln in said.splitlines()
                                                       if DUPLICATE_GPU in ln), "no such line"),
                       f"TRUE if the error or an NCCL WARN line says '{DUPLICATE_GPU}'",
                       claims.TRUE if DUPLICATE_GPU in said else claims.FALSE),
        claims.compare("no rank of the failed launch is left running", data["leftover_ranks"], "<=", 0,
                       figure=f"{data['leftover_ranks']} labutils rank process(es) left after the launch"),
    ]


CLAIMS["05_nccl_one_rank"] = one_rank_log_verdicts
CLAIMS["05_two_ranks_one_gpu"] = two_ranks_one_gpu_verdicts
