"""The shared pieces of every exercise checker (labutils.checks): pass, fail with a HINT, and the
"stub not attempted, so use the reference" step."""
import pytest

from labutils import checks


def reference(p, m):
    return (p - 1) / (m + p - 1)


def stub(p, m):
    raise NotImplementedError


def wrong(p, m):
    return p / m


def broken(p, m):
    raise ZeroDivisionError("oops")


def test_implemented_or_reference_uses_the_reference_for_a_stub_and_says_so(capsys):
    probe = lambda f: f(2, 8)  # noqa: E731
    assert checks.implemented_or_reference(stub, reference, probe) is reference
    out = capsys.readouterr().out
    assert out.startswith("… not attempted: your function still raises NotImplementedError") and \
        "test_checks_common.reference is checked and used instead" in out
    assert checks.implemented_or_reference(wrong, reference, probe) is wrong    # the check judges it
    assert checks.implemented_or_reference(broken, reference, probe) is broken  # ... and this one
    assert capsys.readouterr().out == ""


def test_pass_and_fail():
    checks.passed("x")
    with pytest.raises(checks.ExerciseError, match=r"✗ got 1\. HINT: add one"):
        checks.fail("got 1", "add one")
    assert checks.not_attempted(None) and checks.not_attempted(...) and not checks.not_attempted(0)
