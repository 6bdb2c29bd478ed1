"""Lab 05: running demonstrations side by side and in the background, what NCCL's topology lines mean,
the lab's verdicts (on its recordings and on outcomes that flip them), the exercise checkers on right
and wrong answers (real gloo ranks of one pool), and the notebook's own DETAIL demonstration.

Run: pytest tests/test_lab05.py -q     (CPU only; about a minute on 2 cores, mostly rank start-up)
"""
from __future__ import annotations

import json
import time

import pytest
import torch

import labutils
from labutils import claims, debugging, recorded
from labutils.checks import ExerciseError
from labutils.checks import lab05 as check
from labutils.labs.lab05_debugging import demos, topology
from labutils.labs.lab05_debugging import claims as lab_claims
from labutils.solutions import lab05 as solution

from notebook_defs import load_definitions  # tests/notebook_defs.py

# SYNTHETIC: NCCL 2.28's topology and path lines (as relayed with "[rank r] " prefixes, the two ranks'
# lines interleaved), to pin the parser; the real 2xH200 log is notebooks/recorded/05_nccl_debug_info.json.
TOPOLOGY_LOG = """\
[rank 0] h:1:1 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
[rank 0] h:1:1 [0] NCCL INFO === System : maxBw 240.0 totalBw 240.0 ===
[rank 0] h:1:1 [0] NCCL INFO CPU/0-0 (1/1/2)
[rank 1] h:2:2 [1] NCCL INFO CPU/0-0 (1/1/2)
[rank 0] h:1:1 [0] NCCL INFO + PCI[24.0] - GPU/0-10 (0)
[rank 1] h:2:2 [1] NCCL INFO + PCI[24.0] - GPU/0-10 (0)
[rank 0] h:1:1 [0] NCCL INFO               + NVL[240.0] - NVS/0-0
[rank 1] h:2:2 [1] NCCL INFO               + NVL[240.0] - NVS/0-0
[rank 0] h:1:1 [0] NCCL INFO + PCI[24.0] - GPU/0-20 (1)
[rank 0] h:1:1 [0] NCCL INFO               + NVL[240.0] - NVS/0-0
[rank 0] h:1:1 [0] NCCL INFO + PCI[5000.0] - NIC/0-0
[rank 0] h:1:1 [0] NCCL INFO                 + NET[1.2] - NET/0-0 (0/0/0/1.250000)
[rank 0] h:1:1 [0] NCCL INFO ==========================================
[rank 0] h:1:1 [0] NCCL INFO GPU/0-10 :GPU/0-10 (0/5000.0/LOC) GPU/0-20 (2/240.0/NVL) CPU/0-0 (1/24.0/PHB)
[rank 0] h:1:1 [0] NCCL INFO GPU/0-20 :GPU/0-10 (2/240.0/NVL) GPU/0-20 (0/5000.0/LOC) CPU/0-0 (1/24.0/PHB)
[rank 0] h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
[rank 1] h:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
"""


# ---------------------------------------------------------------- demos

def _boom():
    raise labutils.LaunchConfigError("bad arguments")


def test_timed_keeps_labutils_errors_and_the_time():
    o = demos.timed(lambda: time.sleep(0.05) or 7)
    assert o.value == 7 and o.error is None and o.seconds >= 0.05
    o = demos.timed(_boom)
    assert isinstance(o.error, labutils.LaunchConfigError) and o.value is None
    with pytest.raises(ZeroDivisionError):  # anything else is a bug: it propagates
        demos.timed(lambda: 1 / 0)


def test_background_runs_while_the_caller_goes_on():
    bg = demos.Background()
    t0 = time.perf_counter()
    bg.start("slow", time.sleep, 0.3)
    bg.start("fast", lambda: "done")
    assert time.perf_counter() - t0 < 0.2 and "slow" in bg.running()
    with pytest.raises(ValueError, match="still running"):
        bg.start("slow", time.sleep, 0)
    with pytest.raises(TimeoutError, match="still running after 0.01 s"):
        bg.outcome("slow", timeout=0.01)
    assert bg.outcome("fast").value == "done"
    assert bg.outcome("slow").seconds >= 0.3 and bg.running() == []
    with pytest.raises(KeyError, match="no demonstration 'other'"):
        bg.outcome("other")


def test_side_by_side_runs_at_once_and_keeps_the_order():
    t0 = time.perf_counter()
    out = demos.side_by_side({"b": (time.sleep, (0.3,), {}), "a": (time.sleep, (0.3,), {})})
    assert time.perf_counter() - t0 < 0.55 and list(out) == ["b", "a"]


# ---------------------------------------------------------------- NCCL's topology

def test_parser_reads_the_topology_tree_paths_and_env():
    log = debugging.parse_nccl_log(TOPOLOGY_LOG)
    assert log.topology == [
        debugging.TopoLink("CPU/0-0", "PCI", 24.0, "GPU/0-10"), debugging.TopoLink("GPU/0-10", "NVL", 240.0, "NVS/0-0"),
        debugging.TopoLink("CPU/0-0", "PCI", 24.0, "GPU/0-20"), debugging.TopoLink("GPU/0-20", "NVL", 240.0, "NVS/0-0"),
        debugging.TopoLink("CPU/0-0", "PCI", 5000.0, "NIC/0-0"), debugging.TopoLink("NIC/0-0", "NET", 1.2, "NET/0-0")]
    assert ("NVL", 240.0, "NVS/0-0") in log.links
    assert debugging.TopoPath("GPU/0-10", "GPU/0-20", 2, 240.0, "NVL") in log.paths and len(log.paths) == 6
    assert log.env == {"NCCL_NVLS_ENABLE": "0"}
    assert log.transports == {"P2P/CUMEM": 2}


def test_what_the_topology_numbers_are():
    log = debugging.parse_nccl_log(TOPOLOGY_LOG)
    rows = {(r["from"].split()[-1], r["to"].split()[-1]): r["what the number is"] for r in topology.links_table(log)}
    assert rows[("GPU/0-10", "NVS/0-0")].startswith("12 NVLinks x NCCL's 20 GB/s per link for sm70/sm80")
    assert rows[("CPU/0-0", "NIC/0-0")].startswith("not a PCI rate: NCCL's placeholder 5000 (LOC_BW)")
    assert "PCIe Gen4 x16 in its table" in rows[("CPU/0-0", "GPU/0-10")]
    assert "about 10 Gbit/s" in rows[("NIC/0-0", "NET/0-0")]
    assert topology.nvlink_count(370.8) == (18, "sm90 (Hopper)", 20.6)
    assert topology.nvlink_count(7.0) is None
    assert topology.explain_link(debugging.TopoLink("GPU/0", "NVL", 7.0, "GPU/1")).startswith("NCCL's estimate")
    assert topology.explain_link(debugging.TopoLink("GPU/0", "C2C", 9.0, "CPU/0")) == "C2C link: NCCL's estimate"
    paths = topology.gpu_paths(log)
    assert [(p.src, p.dst) for p in paths] == [("GPU/0-10", "GPU/0-20"), ("GPU/0-20", "GPU/0-10")]
    assert topology.describe_path(paths[0], log) == (
        "GPU/0-10 -> GPU/0-20: 2 hops of NVLink (directly, or through NVSwitches) through NVSwitch NVS/0-0; "
        "NCCL rates it 240 GB/s")


def test_the_recorded_2xh200_topology():
    log = debugging.parse_nccl_log(recorded.load("05_nccl_debug_info").data["log"])
    nvl = [link for link in log.topology if link.kind == "NVL"]
    assert nvl and all(link.dst.startswith("NVS/") for link in nvl)
    assert all(topology.nvlink_count(link.gbps) for link in nvl)
    assert topology.gpu_paths(log) and all(p.type == "NVL" for p in topology.gpu_paths(log))


def test_the_collnet_slot_of_the_channel_line_is_not_read_as_collnet():
    # the recorded 2xH200 line: NCCL's src/init.cc prints comm->nChannels in the "collnet channels" slot too
    text = recorded.load("05_nccl_debug_info").data["log"]
    line = next(ln for ln in text.splitlines() if "collnet channels" in ln)
    assert "24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels" in line
    log = debugging.parse_nccl_log(text)
    assert log.channels == {"coll": 24, "nvls": 0, "p2p": 32, "p2p_per_peer": 32}
    assert log.network == "Socket" and log.collnet_plugin == ""
    summary = debugging.summarize_nccl(log)
    assert "CollNet (reductions inside the network switches): none (NCCL loaded no CollNet plugin)" in summary
    assert "24 CollNet" not in summary
    # SYNTHETIC: what NCCL prints when a CollNet plugin is there (the SHARP plugin of nccl-rdma-sharp-plugins)
    sharp = debugging.parse_nccl_log(line.replace("24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p "
                                                  "channels, 32 p2p channels per peer",
                                                  "NET/Plugin: Loaded collnet plugin SHARP (v8)")
                                     + "\n" + line.replace(line[line.index("NCCL INFO") + 10:], "Using network IB"))
    assert sharp.collnet_plugin == "SHARP"
    assert "plugin SHARP loaded" in debugging.summarize_nccl(sharp)


# ---------------------------------------------------------------- verdicts

def test_verdicts_on_the_recordings():
    for name, fn in lab_claims.CLAIMS.items():
        verdicts = fn(recorded.load(name).data)
        assert verdicts and all(isinstance(v, claims.Verdict) for v in verdicts)


def test_verdicts_flip_with_the_outcome():
    hang = {"outcome": "hang: ranks [1] did not finish within 10 s", "seconds": 10.3}
    err = {"outcome": "error: rank 0 raised RuntimeError: size mismatch", "seconds": 2.0}
    assert [v.verdict for v in lab_claims.mistake_verdicts({"order": hang, "shapes": err})] == ["FALSE", "TRUE"]
    assert lab_claims.wrong_device_verdicts({"message": "ok"})[0].verdict == "TRUE"
    assert lab_claims.outcome_kind("wrong values: no error, sums [4.0, 4.0]") == "wrong values"
    quiet = {"error": "ranks [0, 1] did not finish within 60 s", "seconds": 60.0, "dumps": {},
             "divergence": "no flight records to compare (...)"}
    assert [v.verdict for v in lab_claims.timeout_verdicts(quiet)] == ["FALSE", "FALSE"]
    shm = TOPOLOGY_LOG.replace("via P2P/CUMEM", "via SHM/direct/direct")
    assert [v.verdict for v in lab_claims.nccl_log_verdicts({"log": shm})] == ["FALSE", "TRUE"]
    no_switch = TOPOLOGY_LOG.replace("NVS/0-0", "GPU/0-20")
    assert lab_claims.nccl_log_verdicts({"log": no_switch})[1].verdict == "FALSE"
    assert json.dumps([v.body() for v in lab_claims.nccl_log_verdicts({"log": TOPOLOGY_LOG})])


# ---------------------------------------------------------------- exercise checkers (real gloo ranks)


def test_checked_all_reduce_checker(gloo3, capsys):
    def stub(t):
        raise NotImplementedError
    check.checked_all_reduce(stub, pool=gloo3)
    out, err = capsys.readouterr()
    assert "not attempted" in err and "✓" not in out
    check.checked_all_reduce(solution.checked_all_reduce, pool=gloo3)
    assert "all 3 ranks raise naming rank 2" in capsys.readouterr().out

    def never_checks(t):
        import torch.distributed as dist
        dist.all_reduce(t)
        return t
    with pytest.raises(ExerciseError, match="did not finish within|did not raise"):  # gloo aborts or hangs on the odd shape
        check.checked_all_reduce(never_checks, pool=gloo3)

    def gathers_the_data(t):  # right answers, but it ships every rank's whole tensor to look at its shape
        import torch.distributed as dist
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, t)
        odd = [r for r, x in enumerate(everyone) if x.shape != everyone[0].shape]
        if odd:
            raise ValueError(f"rank {odd[0]} differs")
        dist.all_reduce(t)
        return t
    with pytest.raises(ExerciseError, match="a fingerprint of the call"):
        check.checked_all_reduce(gathers_the_data, pool=gloo3)

    def reduces_twice(t):  # the check done by an all_reduce of the shape, then the data: two all_reduces
        import torch.distributed as dist
        solution.checked_all_reduce(t.new_zeros(1))  # a fingerprint exchange, and a stray all_reduce
        return solution.checked_all_reduce(t)
    with pytest.raises(ExerciseError, match="expected one of the tensor"):
        check.checked_all_reduce(reduces_twice, pool=gloo3)


def test_guarded_step_checker(gloo3, capsys):
    check.guarded_step(solution.guarded_step, pool=gloo3)
    assert "3 ranks average" in capsys.readouterr().out

    def local_branch(rank, world_size, loss, grad):  # the bug the exercise is about
        import torch.distributed as dist
        if torch.isfinite(loss):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad / world_size
        return None
    with pytest.raises(ExerciseError, match="did not finish within.*Decide together"):
        check.guarded_step(local_branch, pool=gloo3)

    def reduce_then_decide(rank, world_size, loss, grad):  # returns the right things, but sends the gradient
        import torch.distributed as dist
        grad = grad.clone()
        dist.all_reduce(grad)
        ok = torch.isfinite(loss).to(torch.int32).reshape(1)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return grad / world_size if ok.item() else None
    with pytest.raises(ExerciseError, match="decide first, then skip"):
        check.guarded_step(reduce_then_decide, pool=gloo3)


def test_prediction_outcome(capsys):
    check.prediction_outcome(None, {"gloo": "error"})
    check.prediction_outcome("hang", {"gloo": "error", "nccl": "hang"})
    out = capsys.readouterr().out
    assert "no prediction written" in out and "✗ gloo" in out and "✓ nccl" in out


# ---------------------------------------------------------------- the notebook's own code

def test_notebook_detail_demo_names_both_sides(no_leaks):
    nb = load_definitions("05_debugging")
    said = labutils.launch(nb.mistakes_under_detail, world_size=2, backend="gloo", timeout=120,
                           env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, output="quiet")[0]
    assert debugging.explain_mismatch(said["order"]) == "rank 0: ALLREDUCE([4], Float) / rank 1: BROADCAST([4], Float)"
    assert debugging.explain_mismatch(said["shapes"]) == "rank 0: ALLREDUCE([4], Float) / rank 1: ALLREDUCE([5], Float)"
    assert said["same call everywhere"] == "ok" and said["wrong device (CPU tensor)"] == "ok"  # gloo: CPU is right
