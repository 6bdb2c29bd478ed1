"""claims.every judges a claim on every measured point: one failing point makes it FALSE."""
import pytest

from labutils import claims


def test_every_point_must_hold():
    pts = {"512 tokens": 1.42, "2048 tokens": 1.34, "8192 tokens": 0.98}
    v = claims.every("SP costs no more than TP", pts, "<=", 1.05, unit="x")
    assert v.verdict == "FALSE" and "worst 1.42x at 512 tokens" in v.figure
    assert claims.every("SP costs no more than TP", {"8192 tokens": 0.98}, "<=", 1.05).verdict == "TRUE"
    assert claims.every("at least", {"a": 2.0, "b": 1.2}, ">=", 1.5).figure.startswith("worst 1.2 at b")


@pytest.mark.parametrize("points", [{}, {"a": float("nan")}])
def test_every_refuses_no_or_broken_points(points):
    with pytest.raises(ValueError, match="HINT"):
        claims.every("c", points, "<=", 1.0)
