"""``nccl_groups.nccl_group`` (lab 02's paths and lab 08's CTA sweep) off the GPU: the errors. On NCCL it
is tested in tests/gpu/test_lab08_gpu.py."""
import sys

import cloudpickle
import pytest

from labutils import nccl_groups

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks get these functions by value


def _make_group(rank, world_size):
    from labutils import nccl_groups
    try:
        nccl_groups.nccl_group(4)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_nccl_group_refuses_bad_counts_and_gloo(gloo2):
    """A clear error for a CTA count that is not a positive int, and for a gloo process group, which has
    no CTAs."""
    for bad in (0, -2, True, 1.5, "8"):
        with pytest.raises(ValueError, match="int >= 1"):
            nccl_groups.nccl_group(bad)
    for message in gloo2.run(_make_group):
        assert "needs the NCCL backend" in message and "gloo" in message and "HINT" in message
