"""The shared pieces of every exercise checker (labutils.checks): pass, fail with a HINT, the one rank
runner, and the "stub not attempted: say so, give a stand-in" step."""
import pytest

from labutils import checks


def stub(p, m):
    raise NotImplementedError


def wrong(p, m):
    return p / m


def broken(p, m):
    raise ZeroDivisionError("oops")


def test_implemented_or_standin_gives_the_stand_in_for_a_stub_and_says_so_on_stderr(capsys):
    probe = lambda f: f(2, 8)  # noqa: E731
    stand_in = checks.standin(lambda p, m: 0.5, "a stand-in model")
    assert checks.is_standin(stand_in) and not checks.is_standin(wrong)
    assert checks.implemented_or_standin(stub, stand_in, probe, "my_bubble") is stand_in
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("… not attempted: my_bubble still raises NotImplementedError") and \
        "no points" in err and "a stand-in model in its place" in err
    assert checks.implemented_or_standin(wrong, stand_in, probe, "x") is wrong    # the check judges it
    assert checks.implemented_or_standin(broken, stand_in, probe, "x") is broken  # ... and this one
    assert capsys.readouterr() == ("", "")


def test_checkers_never_import_the_reference_solutions():
    """The student edition ships without labutils/solutions: no checker may need it."""
    import pathlib
    import re
    for path in sorted((pathlib.Path(checks.__file__).parent).glob("*.py")):
        assert not re.search(r"^\s*(from\s+(labutils|\.+)\.?solutions|import\s+labutils\.solutions)",
                             path.read_text(), re.M), path.name


def test_run_ranks_refuses_a_pool_of_another_size_or_backend():
    class Pool:
        backend, world_size = "nccl", 2
    with pytest.raises(ValueError, match=r"3 gloo ranks.*2 'nccl' ranks.*HINT: pass labutils.RankPool\(world_size=3"):
        checks.run_ranks(print, world_size=3, pool=Pool())
    with pytest.raises(ValueError, match="backend='gloo'"):
        checks.run_ranks(print, world_size=2, pool=Pool())


def test_pass_and_fail():
    checks.passed("x")
    with pytest.raises(checks.ExerciseError, match=r"✗ got 1\. HINT: add one"):
        checks.fail("got 1", "add one")
    assert checks.not_attempted(None) and checks.not_attempted(...) and not checks.not_attempted(0)
