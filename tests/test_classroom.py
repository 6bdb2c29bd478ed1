"""classroom release -> a simulated class on lab 03 -> classroom grade.

One learner solves both rings, one leaves the notebook untouched, one submits a ring all-gather that
deadlocks, one a cell that kills its kernel, one calls the reference solution. The gradebook must give each the right points and reasons; the student edition must carry no
solution text and run end to end untouched; nothing may be left running.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader")

from labutils import procs  # noqa: E402
from labutils.classroom import release  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

RING_ALL_GATHER = '''def my_ring_all_gather(output, input):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[rank].copy_(input.reshape(-1))
    for s in range(n - 1):
        ops = [dist.P2POp(dist.isend, chunks[(rank - s) % n], (rank + 1) % n),
               dist.P2POp(dist.irecv, chunks[(rank - s - 1) % n], (rank - 1) % n)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
'''
RING_ALL_REDUCE = '''def my_ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)
    for s in range(n - 1):
        buf = torch.empty_like(chunks[(rank - s - 1) % n])
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(rank - s) % n], (rank + 1) % n),
                                         dist.P2POp(dist.irecv, buf, (rank - 1) % n)]):
            q.wait()
        chunks[(rank - s - 1) % n].add_(buf)
    for s in range(n - 1):
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(rank + 1 - s) % n], (rank + 1) % n),
                                         dist.P2POp(dist.irecv, chunks[(rank - s) % n], (rank - 1) % n)]):
            q.wait()
'''
DEADLOCKING_RING = '''def my_ring_all_gather(output, input):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[rank].copy_(input.reshape(-1))
    for s in range(n - 1):  # every rank receives first: nobody ever sends
        dist.recv(chunks[(rank - s - 1) % n], src=(rank - 1) % n)
        dist.send(chunks[(rank - s) % n], dst=(rank + 1) % n)
'''
PIPELINED = '''def my_pipelined_all_reduce(chunks, produce):
    works = []
    for i, chunk in enumerate(chunks):
        produce(i)
        works.append(dist.all_reduce(chunk, async_op=True))
    for w in works:
        w.wait()
'''
CALLS_THE_ANSWER = '''def my_ring_all_gather(output, input):
    from labutils.solutions import lab03
    lab03.ring_all_gather(output, input)
'''


def _answer(nb, grade_id: str, source: str) -> None:
    cell, = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    cell.source = source


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    d = tmp_path_factory.mktemp("class")
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "release", "03", str(d)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return d


def test_release_writes_instructor_and_student_editions(course):
    student = course / "student"
    nb = nbformat.read(student / "notebooks" / "03_async_p2p.ipynb", 4)
    answers = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    tests = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert len(answers) == 3 and all("raise NotImplementedError()" in c.source for c in answers)
    assert [c.metadata.nbgrader["points"] for c in tests] == [2, 3, 3]
    assert (student / "labutils" / "checks" / "lab03.py").exists()
    assert not (student / "labutils" / "solutions").exists()
    assert (student / "notebooks" / "recorded").is_dir()
    source = nbformat.read(course / "source" / "lab03" / "03_async_p2p.ipynb", 4)
    assert any("### BEGIN SOLUTION" in c.source for c in source.cells)  # the instructor's edition keeps them


def test_student_edition_holds_no_solution_text(course):
    """Searched for: nbgrader's markers, an import of the solutions, and every pair of lines of a reference
    solution that the lessons do not show anyway."""
    snippets = release.solution_snippets()
    assert len(snippets) > 50
    assert release.find_solution_text(ROOT / "labutils" / "solutions")  # the search finds the solutions
    assert release.find_solution_text(course / "student") == []
    text = "\n".join(p.read_text(errors="replace") for p in (course / "student").rglob("*") if p.is_file())
    assert "BEGIN SOLUTION" not in text
    lab03 = [course / "student" / "labutils" / "checks" / "lab03.py", course / "student" / "notebooks" / "03_async_p2p.ipynb",
             *(course / "student" / "labutils" / "labs" / "lab03_async_p2p").glob("*.py")]
    assert not any("solutions import" in p.read_text() or "from ..solutions" in p.read_text() for p in lab03)
    assert "_step(chunks[(r - s) % n], chunks[(r - s - 1) % n], right, left, group)" not in text  # lab 03's answer


def test_a_class_is_graded(course, tmp_path):
    """solved: 8/8; untouched: 0/8, "not attempted" (the notebook ran to its end on the stand-ins, with
    labutils.solutions unimportable, as in a student's environment); deadlock: the ring all-gather scores 0
    with the deadlock HINT; a submission that kills its kernel: 0, "not graded", and the others unharmed; one
    that calls the reference solution: 0 (grading runs without it). No process is left."""
    before = {p.pid for p in procs.leftover_ranks()}
    released = nbformat.read(course / "student" / "notebooks" / "03_async_p2p.ipynb", 4)
    subs = course / "collected"
    for learner, answers in {"ada": {"pipelined_all_reduce": PIPELINED, "ring_all_gather": RING_ALL_GATHER,
                                     "ring_all_reduce": RING_ALL_REDUCE},
                             "bob": {},
                             "cyd": {"ring_all_gather": DEADLOCKING_RING},
                             "dee": {"ring_all_gather": "import os\nos._exit(1)  # kills the kernel\n"},
                             "eve": {"ring_all_gather": CALLS_THE_ANSWER}}.items():
        nb = nbformat.from_dict(released)
        for gid, src in answers.items():
            _answer(nb, gid, src)
        (subs / learner).mkdir(parents=True)
        nbformat.write(nb, subs / learner / "03_async_p2p.ipynb")
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "grade", str(subs), "--cell-timeout", "120",
                        "--learner-timeout", "240"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {(row["learner"], row["exercise"]): row for row in csv.DictReader(open(course / "gradebook.csv"))}
    points = {k: float(v["points"]) for k, v in rows.items()}
    assert points == {("ada", "check_pipelined_all_reduce"): 2, ("ada", "check_ring_all_gather"): 3,
                      ("ada", "check_ring_all_reduce"): 3,
                      **{(who, ex): 0 for who in ("bob", "cyd", "dee", "eve")
                         for ex in ("check_pipelined_all_reduce", "check_ring_all_gather", "check_ring_all_reduce")}}, r.stdout
    assert rows["ada", "check_ring_all_gather"]["status"] == "passed"
    assert rows["bob", "check_ring_all_gather"]["status"] == "not attempted"
    assert "torch's dist.all_gather_into_tensor" in rows["bob", "check_ring_all_gather"]["reason"]
    deadlock = rows["cyd", "check_ring_all_gather"]
    assert deadlock["status"] == "failed" and "did not finish within" in deadlock["reason"]
    assert "HINT: post each step's send and receive together" in deadlock["reason"]
    assert rows["cyd", "check_ring_all_reduce"]["status"] == "not attempted"
    assert "No module named 'labutils.solutions'" in rows["eve", "check_ring_all_gather"]["reason"]
    crashed = rows["dee", "check_ring_all_gather"]
    assert crashed["status"] == "not graded" and "the kernel died" in crashed["reason"]
    table = (course / "gradebook.md").read_text()
    assert "8/8" in table and "0/8" in table and "not attempted" in table and "HINT" in table
    untouched = nbformat.read(course / "autograded" / "bob" / "lab03" / "03_async_p2p.ipynb", 4)
    errors = [o for c in untouched.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == [], "the untouched student edition must run end to end"
    assert [p.pid for p in procs.leftover_ranks(wait_s=5) if p.pid not in before] == []


def test_release_of_lab07_clears_its_exercise_cells(tmp_path):
    """Lab 07's exercises are rank-side and derived functions: the student's keep the signature, the docstring
    and the stub line, then nbgrader's stub, and hold no answer; the instructor's keep theirs."""
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "release", "07", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    nb = nbformat.read(tmp_path / "student" / "notebooks" / "07_interactive_ranks.ipynb", 4)
    answers = {c.metadata.nbgrader["grade_id"]: c.source for c in nb.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    assert set(answers) == {"all_agree", "break_even"}
    assert answers["all_agree"].startswith("def all_agree(flag) -> bool:")
    assert answers["break_even"].startswith("def break_even(start_s, launch_s, roundtrip_s, work_s=0.0):")
    assert all(a.endswith("# ✍ YOUR CODE HERE\n    raise NotImplementedError()") for a in answers.values()), answers
    tests = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader["points"] for c in tests] == [2, 2]  # as INSTRUCTORS.md counts lab 07
    assert release.find_solution_text(tmp_path / "student") == []
    text = "\n".join(c.source for c in nb.cells)
    assert "solution.all_agree" not in text and "solution.break_even" not in text
    source = nbformat.read(tmp_path / "source" / "lab07" / "07_interactive_ranks.ipynb", 4)
    assert sum("### BEGIN SOLUTION" in c.source for c in source.cells) == 2


def test_grade_refuses_a_folder_that_is_no_course(tmp_path):
    (tmp_path / "subs" / "ada").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "grade", str(tmp_path / "subs")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "is not a released course" in r.stderr and "HINT" in r.stderr


def test_release_refuses_an_unknown_lab_and_writes_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "release", "42", str(tmp_path / "class")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no lab '42'" in r.stderr and not (tmp_path / "class").exists()
