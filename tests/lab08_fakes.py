"""Synthetic lab 08 recordings with the structure ``measure.ddp/zero/fsdp`` returns, for tests of the
verdicts and of the notebook's plotting cells on machines without GPUs. Never written to
notebooks/recorded/: the figures are invented (``scale`` moves them across the thresholds)."""
from __future__ import annotations

from labutils.labs.lab08_data_parallel import memory, trace
from labutils.labs.lab08_data_parallel import model as M

PSI = M.n_params(M.BENCH)


OPTIMIZER_KERNEL = "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>, FusedAdamMathFunctor>"


def _events(comm_after_backward: bool, comm: bool = True, optimizer_wait: float | None = None) -> list[dict]:
    """A step's kernels: forward GEMMs, backward GEMMs, NCCL all-reduces beside or after them (or none:
    ``comm=False``, a no_sync step); with ``optimizer_wait`` (us), AdamW's kernels that long after the
    last backward kernel (and after the last all-reduce)."""
    ev, t = [], 0.0
    for name, n in (("forward", 20), ("backward", 40)):
        start = t
        for _ in range(n):
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": t, "dur": 900.0})
            t += 1000.0
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": start, "dur": t - start})
    comm_start = t if comm_after_backward else 22000.0
    last_comm = comm_start
    for k in range(8 if comm else 0):
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "ts": comm_start + k * 600.0, "dur": 500.0})
        last_comm = comm_start + k * 600.0 + 500.0
    if optimizer_wait is not None:
        backward_end = t - 100.0  # the last GEMM's end
        opt = max(backward_end + optimizer_wait, last_comm if comm else 0.0)
        for k in range(3):
            ev.append({"ph": "X", "cat": "kernel", "name": OPTIMIZER_KERNEL, "ts": opt + k * 300.0, "dur": 250.0})
    return ev


def _traces(labels: dict, world_size: int, **tags) -> dict:
    """``{label: [summary per rank]}`` from ``{label: (comm_after_backward, comm)}``."""
    return {label: [dict(trace.summarize(_events(after, comm, optimizer_wait=10.0), lane=f"rank {rank}"),
                         file=None, steps=1, **tags)
                    for rank in range(world_size)]
            for label, (after, comm) in labels.items()}


def _timeline_fields(overlap_fraction: float, excess: float, accounted: float, tail: float) -> dict:
    """A row's timeline (two ranks alike) whose stretch + tail is ``accounted`` times ``excess``."""
    one = {"overlap_fraction": overlap_fraction, "stretch_ms": accounted * excess - tail, "tail_ms": tail,
           "excess_ms": excess, "comm_ms": 5.0, "overlap_ms": 5.0 * overlap_fraction, "compute_ms": 70.0,
           "no_sync_compute_ms": 70.0 - (accounted * excess - tail), "no_sync_tail_ms": 0.0,
           "traced_step_ms": 72.0 + excess, "traced_no_sync_ms": 72.0}
    return dict({k: one[k] for k in ("overlap_fraction", "stretch_ms", "tail_ms", "excess_ms")}, timeline=[one, one])


def ddp(speedup: float = 1.93, overlap_best: float = 0.95, cost: float = 0.2, accounted: float = 1.0,
        tail_share: float = 0.02, one_overlap: float = 0.05, wrapper: float = 0.005, few_ctas_gain: float = 0.02,
        saved_psi: float = 4.0, world_size: int = 2, traced: bool = True, comm: float = 5.6) -> dict:
    """A recording in ``measure.ddp``'s format whose verdicts sit where the arguments put them: the fastest
    configuration is 25 MB on 4 CTAs, ``few_ctas_gain`` faster than 25 MB on NCCL's default; ``cost`` is its
    exposed time over its all-reduces alone, ``accounted`` its (stretch + tail) / traced excess, ``tail_share``
    its tail over the all-reduces alone; ``comm`` the all-reduces alone (ms; the best step is about 67 ms).
    ``traced=False``: a run on CPU ranks (no timeline, no CTAs)."""
    plain = 65.0
    no_sync = plain * (1 + wrapper)
    best_step = world_size * plain / speedup
    default25 = best_step / (1 - few_ctas_gain)

    def row(cap, ctas, step, overlap_fraction=0.9, exposed=None, tail=0.05):
        n = max(1, int(4 * PSI / (cap * 2**20)))
        exposed = step - no_sync if exposed is None else exposed
        r = {"bucket_cap_mb": cap, "ctas": ctas, "bucket_bytes": [4 * PSI // n] * n, "n_buckets": n,
             "volume_psi": 2.0, "step_ms": step, "no_sync_ms": no_sync, "comm_ms": comm, "spread": 0.004,
             "exposed_ms": exposed, "exposed_samples_ms": [exposed] * 8}
        if traced:
            r.update(_timeline_fields(overlap_fraction, excess=exposed * 1.2, accounted=1.0, tail=tail))
        else:
            r.update({"timeline": None, "overlap_fraction": None, "stretch_ms": None, "tail_ms": None,
                      "excess_ms": None})
        return r

    sweep = [row(1, None, default25 + 0.5), row(25, None, default25),
             row(2048, None, default25 + 3.0, overlap_fraction=one_overlap, tail=comm)]
    if traced:
        for ctas in (8, 4):
            sweep.append(row(25, ctas, best_step if ctas == 4 else (best_step + default25) / 2))
        b = sweep[-1]
        b["exposed_ms"] = cost * comm
        b.update(_timeline_fields(overlap_best, excess=b["exposed_ms"] * 1.2, accounted=accounted,
                                  tail=tail_share * comm))
    else:
        sweep[1].update(step_ms=best_step, exposed_ms=cost * comm)
    memory = {"bucket_cap_mb": 25, "ctas": 4 if traced else None,
              "view": {"state_bytes": 16.0 * PSI, "grad_copy_bytes": 0.0},
              "no_view": {"state_bytes": (16.0 + saved_psi) * PSI, "grad_copy_bytes": saved_psi * PSI}}
    traces = {}
    if traced:
        traces = _traces({"one bucket": (True, True)}, world_size, bucket_cap_mb=2048, ctas=None)
        traces.update(_traces({"best": (False, True), "best, CPU activity": (False, True)}, world_size,
                              bucket_cap_mb=25, ctas=4))
    return {"config": dict(M.BENCH), "world_size": world_size, "n_params": PSI, "gpu": "NVIDIA H200" if traced
            else "cpu", "compute_ms": plain, "cta_cap_mb": 25 if traced else None, "sweep": sweep, "memory": memory,
            "traces": traces}


def no_timeline_ddp(speedup: float = 1.93, hidden_best: float = 0.8) -> dict:
    """A recording in the format ``measure.ddp`` wrote before the paired difference and the timeline: the
    sweep's rows without ``exposed_ms`` and the timeline fields, traces taken with CPU activity."""
    d = ddp(speedup=speedup)
    for r in d["sweep"]:
        for k in ("exposed_ms", "exposed_samples_ms", "timeline", "overlap_fraction", "stretch_ms", "tail_ms",
                  "excess_ms"):
            r.pop(k)
    best = min(d["sweep"], key=lambda r: r["step_ms"])
    best["comm_ms"] = (best["step_ms"] - best["no_sync_ms"]) / (1 - hidden_best)  # exactly hidden_best hidden
    one = max(d["sweep"], key=lambda r: r["bucket_cap_mb"])
    one["comm_ms"] = (one["step_ms"] - one["no_sync_ms"]) / 1.5  # hidden: -50%
    d["traces"] = _traces({"one bucket": (True, True), "best": (False, True), "best, no_sync": (False, False)}, 2)
    return d


def zero(off_by: float = 0.03, world_size: int = 2) -> dict:
    rows = []
    for scheme, calls in (("DDP", {"all_reduce": 290}), ("ZeRO-1", {"reduce_scatter": 290, "all_gather": 290}),
                          ("ZeRO-2", {"reduce_scatter": 290, "all_gather": 290})):
        pred = memory.predicted_bytes(scheme, PSI, world_size)
        rows.append({"scheme": scheme, "peak_bytes": pred * (1 + off_by), "predicted_bytes": pred,
                     "volume_psi": 2.0, "calls": calls})
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "rows": rows}


def fsdp(state_ratio: float = 0.51, world_size: int = 2, traced: bool = True) -> dict:
    ddp_state = 16.0 * PSI
    rows = [
        {"name": "DDP", "state_bytes": ddp_state, "peak_bytes": ddp_state + 20e9, "volume_psi": 2.0,
         "calls": {"all_reduce": 76}, "step_ms": 67.0},
        {"name": "FSDP2", "state_bytes": ddp_state * state_ratio, "peak_bytes": ddp_state / 2 + 21e9,
         "volume_psi": 2.999, "calls": {"all_gather": 49, "reduce_scatter": 25}, "step_ms": 70.0},
        {"name": "FSDP2, reshard_after_forward=False", "state_bytes": ddp_state * state_ratio,
         "peak_bytes": ddp_state / 2 + 21.6e9, "volume_psi": 2.0, "calls": {"all_gather": 25, "reduce_scatter": 25},
         "step_ms": 69.0},
        {"name": f"FSDP2, prefetch {M.BENCH['prefetch']} blocks", "state_bytes": ddp_state * state_ratio,
         "peak_bytes": ddp_state / 2 + 21.2e9, "volume_psi": 2.999,
         "calls": {"all_gather": 49, "reduce_scatter": 25}, "step_ms": 69.9},
    ]
    if traced:  # measure.traced_variants: FSDP2's default and explicit prefetch
        for r in (rows[1], rows[3]):
            r["trace"] = [{k: v for k, v in t.items() if k != "spans"}
                          for t in _traces({"x": (False, True)}, world_size)["x"]]
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "rows": rows}


def write_all(directory) -> None:
    """Save the three fakes as recordings in ``directory`` (for executing the notebook without GPUs)."""
    from labutils import recorded
    for name, data in (("08_ddp", ddp()), ("08_zero", zero()), ("08_fsdp", fsdp())):
        recorded.save(name, data, fingerprint="SYNTHETIC test data | not a measurement", directory=directory)


def build_ddp_answers() -> dict:
    """Wrong-but-plausible answers to "build your DDP" (b) and (c), defined in a function so that cloudpickle
    sends them by value to the ranks. Each is a class of the exercises' protocol: ``cls(model[, cap])``,
    then ``finish()`` after every backward."""
    import torch
    import torch.distributed as dist
    from labutils.solutions import lab08 as S

    class Stub:
        def __init__(self, model, *args):
            raise NotImplementedError

        def finish(self):
            raise NotImplementedError

    class AfterBackward:  # hooks only note the gradient; the all-reduces start in finish(): no overlap
        def __init__(self, model):
            self.ready = []
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(self.ready.append)

        def finish(self):
            handles = [dist.all_reduce(p.grad, async_op=True) for p in self.ready]
            for h, p in zip(handles, self.ready):
                h.wait()
                p.grad /= dist.get_world_size()
            self.ready.clear()

    class OverlappedSum(S.OverlappedGradients):  # forgets the average
        def start(self, p):
            self.handles.append(dist.all_reduce(p.grad, async_op=True))

    class TensorHook:  # p.register_hook runs on the incoming gradient, before it is accumulated into p.grad
        def __init__(self, model):
            self.handles, self.n = [], dist.get_world_size()
            for p in model.parameters():
                p.register_hook(self.start)

        def start(self, grad):
            grad = grad / self.n
            self.handles.append(dist.all_reduce(grad, async_op=True))
            return grad

        def finish(self):
            for h in self.handles:
                h.wait()
            self.handles.clear()

    class Blocking(S.OverlappedGradients):  # all-reduces from the hooks, but each one waited for there
        def start(self, p):
            p.grad /= self.world_size
            dist.all_reduce(p.grad)

    class NeverReset(S.BucketedGradients):  # right once; the count of missing gradients is never reset
        def finish(self):
            pending = self.pending
            super().finish()
            self.pending = pending

    class EarlyBucket(S.BucketedGradients):  # off by one: launches while one gradient is still missing
        def __init__(self, model, cap):
            super().__init__(model, cap)
            self.pending = [len(b) - 1 for b in self.buckets]

        def ready(self, p):
            b, offset = self.where[p]
            self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self.buffers[b] /= self.world_size
                self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))

        def finish(self):
            super().finish()
            self.pending = [len(b) - 1 for b in self.buckets]

    class BucketedSum(S.BucketedGradients):
        def ready(self, p):
            b, offset = self.where[p]
            self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))

    class PerParameter(S.OverlappedGradients):  # (b) handed in as (c)
        def __init__(self, model, cap):
            super().__init__(model)

    class ForwardOrder(S.BucketedGradients):  # buckets packed in forward order
        def __init__(self, model, cap):
            class Reversed(torch.nn.Module):
                def __init__(self, params):
                    super().__init__()
                    self.ps = list(params)

                def parameters(self, recurse=True):
                    return iter(self.ps[::-1])
            super().__init__(Reversed(model.parameters()), cap)

    class FlushInFinish(S.BucketedGradients):  # every bucket, full or not, started in finish()
        def ready(self, p):
            b, offset = self.where[p]
            self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))

        def finish(self):
            for buffer in self.buffers:
                buffer /= self.world_size
                self.handles.append(dist.all_reduce(buffer, async_op=True))
            super().finish()

    return {"stub": Stub, "after_backward": AfterBackward, "overlapped_sum": OverlappedSum,
            "tensor_hook": TensorHook, "never_reset": NeverReset, "blocking": Blocking, "early_bucket": EarlyBucket,
            "bucketed_sum": BucketedSum, "per_parameter": PerParameter, "forward_order": ForwardOrder,
            "flush_in_finish": FlushInFinish}


def build_ddp(no_sync: float = 3.0, comm: float = 1.7, hidden_b: float = 0.8, hidden_c: float = 0.85,
              ddp_ratio: float = 1.02, standins: tuple = ()) -> dict:
    """A recording in ``build_measure.build_ddp``'s format: the naive step exposes all of ``comm``; (b) and
    (c) hide ``hidden_b`` / ``hidden_c`` of it; the bucketed step is ``ddp_ratio`` x DDP's."""
    exposed = {"no_sync": 0.0, "naive": comm, "overlapped": comm * (1 - hidden_b),
               "bucketed": comm * (1 - hidden_c)}
    steps = {k: no_sync + v for k, v in exposed.items()}
    steps["DDP"] = steps["bucketed"] / ddp_ratio  # DDP's row: what makes the bucketed step ddp_ratio x it
    exposed["DDP"] = steps["DDP"] - no_sync
    calls = {"no_sync": 0, "naive": 64, "overlapped": 64, "bucketed": 17, "DDP": 17}
    rows = [{"name": k, "step_ms": steps[k], "exposed_ms": exposed[k], "exposed_samples_ms": [exposed[k]] * 15,
             "all_reduces": calls[k], "size_bytes": 0 if k == "no_sync" else 537_133_056, "sizes": []}
            for k in ("no_sync", "naive", "overlapped", "bucketed", "DDP")]
    return {"rows": rows, "comm_ms": comm, "config": {"bucket_cap_mb": 25}, "world_size": 2,
            "n_params": 134_283_264, "gradient_bytes": 537_133_056, "comm_fraction": comm / (no_sync + comm),
            "standins": {k: k in standins for k in ("naive", "overlapped", "bucketed")}, "gpu": "NVIDIA H200"}
