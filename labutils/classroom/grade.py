"""``python -m labutils classroom grade SUBMISSIONS_DIR``: autograde submitted notebooks into a gradebook.

    python -m labutils classroom grade ~/class/collected --course ~/class --cell-timeout 120

``SUBMISSIONS_DIR/<learner>/NN_topic.ipynb`` are the learners' notebooks (the released ones, worked on);
``--course`` is the folder ``classroom release`` wrote (default: the folder that holds SUBMISSIONS_DIR).
Each learner is graded by nbgrader's ``autograde`` in a process of its own, with a time limit per cell
(``--cell-timeout``) and per learner (``--learner-timeout``): a submission that hangs, crashes its kernel
or leaves ranks behind costs that learner's points only; every process it started is killed before the
next learner. nbgrader restores the locked test cells before running, so a learner cannot edit a check, and the
submission runs without ``labutils.solutions`` (as in the student edition), so it cannot call the answers.
The gradebook is ``gradebook.csv`` (one row per learner, lab and exercise: points, status, the reason) and
``gradebook.md`` (learner x exercise, then every failure with its HINT), printed at the end.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..procs import leftover_ranks
from .release import assignment_name


# Put first on a graded kernel's (and its ranks') path: a submission cannot import the reference solutions
# that the instructor's installation carries -- it runs as it would in the student's own environment.
NO_SOLUTIONS = '''"""Written by python -m labutils classroom grade: labutils.solutions cannot be imported here."""
import importlib.abc
import sys


class NoSolutions(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "labutils.solutions" or name.startswith("labutils.solutions."):
            raise ModuleNotFoundError(f"No module named {name!r}: submissions are graded without the "
                                      "reference solutions, as in the student edition")
        return None


sys.meta_path.insert(0, NoSolutions())
'''


def grading_env(course: Path) -> dict:
    """The environment nbgrader, the kernels and the ranks of a graded submission run in."""
    guard = course / ".grading"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(NO_SOLUTIONS)
    path = [str(guard)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}


@dataclass
class Row:
    learner: str
    lab: str
    exercise: str
    points: float
    max_points: float
    status: str   # passed | failed | not attempted | not graded
    reason: str


def add_arguments(parser) -> None:
    parser.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR",
                        help="one folder per learner, holding that learner's lab notebooks")
    parser.add_argument("--course", type=Path, default=None,
                        help="the folder classroom release wrote (default: the parent of SUBMISSIONS_DIR)")
    parser.add_argument("--cell-timeout", type=float, default=300.0,
                        help="seconds one cell may run before it is interrupted (default 300)")
    parser.add_argument("--learner-timeout", type=float, default=1800.0,
                        help="seconds one learner's grading may take in all (default 1800)")


def _check_course(course: Path) -> None:
    if not (course / "gradebook.db").exists() or not (course / "source").is_dir():
        raise SystemExit(f"grade: {course} is not a released course (no gradebook.db / source/). HINT: pass "
                         "--course DIR, the folder 'python -m labutils classroom release' wrote.")


def _kill(pids: set[int]) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def autograde_one(course: Path, assignment: str, learner: str, cell_timeout: float,
                  learner_timeout: float) -> tuple[str, str]:
    """Run nbgrader autograde for one learner in its own session; returns (status, log tail). Every
    process it started (kernel, ranks) is gone when this returns."""
    cmd = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", learner, "--force",
           f"--CourseDirectory.root={course}", f"--Execute.timeout={int(cell_timeout)}",
           "--Execute.interrupt_on_timeout=True", "--Execute.startup_timeout=120"]
    env = grading_env(course)
    log = course / "autograded" / f".{learner}-{assignment}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=course,
                                start_new_session=True)
        deadline = time.monotonic() + learner_timeout
        status = "ok"
        while proc.poll() is None:
            try:  # remember every descendant: an orphaned rank is no longer below us
                seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.Error:
                pass
            if time.monotonic() > deadline:
                status = f"stopped after {learner_timeout:g} s"
                break
            time.sleep(0.5)
        _kill(seen | {proc.pid})
        proc.wait()
        if status == "ok" and proc.returncode != 0:
            status = f"nbgrader exited with {proc.returncode}"
    _kill({p.pid for p in leftover_ranks()})
    tail = log.read_text()[-6000:] if log.exists() else ""
    return status, tail


def why_not_graded(status: str, log: str) -> str:
    """One sentence for a learner whose notebook nbgrader could not finish, from its status and log."""
    if status.startswith("stopped after"):
        return (f"grading was {status} (--learner-timeout): the submission hung outside the checkers' own "
                "time limits; its processes were killed")
    if "DeadKernelError" in log or "Kernel died" in log:
        return "the kernel died while the notebook ran (the submission crashed it); its processes were killed"
    if "CellTimeoutError" in log or "timed out" in log:
        return "a cell ran longer than --cell-timeout and was interrupted"
    errors = [ln.strip() for ln in log.splitlines() if "Error" in ln and "AutogradeApp" not in ln]
    return f"nbgrader could not grade it ({status}): {errors[-1] if errors else 'see its log in autograded/'}"


def _cell_outcome(cell) -> tuple[str, str]:
    """(status, reason) of an autograded test cell from its outputs, the way nbgrader scores it."""
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            text = out.get("evalue", "") or out.get("ename", "")
            return "failed", f"{out.get('ename', 'Error')}: {text}".strip()
        if out.output_type == "stream" and out.name == "stderr":
            text = " ".join(out.text.split())
            return ("not attempted" if "not attempted" in text else "failed"), text
    return "passed", ""


def collect(course: Path, learners: list[str], graded: dict) -> list[Row]:
    """Rows of the gradebook: points from nbgrader's gradebook, reasons from the autograded notebooks."""
    import nbformat
    from nbgrader.api import Gradebook
    rows = []
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for assignment in sorted(a.name for a in gb.assignments):
            source = sorted((course / "source" / assignment).glob("*.ipynb"))
            for nb_path in source:
                cells = [c for c in nbformat.read(nb_path, 4).cells
                         if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
                for learner in learners:
                    status, why = graded.get((learner, assignment), ("not submitted", ""))
                    done = course / "autograded" / learner / assignment / nb_path.name
                    outs = {}
                    if done.exists():
                        outs = {c.metadata["nbgrader"]["grade_id"]: c for c in nbformat.read(done, 4).cells
                                if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
                    for cell in cells:
                        gid, max_points = cell.metadata.nbgrader["grade_id"], float(cell.metadata.nbgrader["points"])
                        points = 0.0
                        if gid in outs and status == "ok":
                            try:
                                grade = gb.find_grade(gid, nb_path.stem, assignment, learner)
                                points = float(grade.score)
                            except Exception:  # noqa: BLE001 - not in the gradebook: not graded
                                points = 0.0
                            outcome, reason = _cell_outcome(outs[gid])
                        else:
                            outcome = "not graded"
                            reason = why or status
                        rows.append(Row(learner, nb_path.stem, gid, points, max_points, outcome, reason))
    return rows


def write_gradebook(rows: list[Row], out_dir: Path) -> tuple[Path, Path, str]:
    """``gradebook.csv`` and ``gradebook.md`` in ``out_dir``; returns their paths and the table's text."""
    import pandas as pd
    csv_path, md_path = out_dir / "gradebook.csv", out_dir / "gradebook.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["learner", "lab", "exercise", "points", "max_points", "status", "reason"])
        for r in rows:
            w.writerow([r.learner, r.lab, r.exercise, f"{r.points:g}", f"{r.max_points:g}", r.status, r.reason])
    df = pd.DataFrame([r.__dict__ for r in rows])
    if df.empty:
        text = "no submissions graded"
    else:
        df["cell"] = [f"{p:g}/{m:g}" + ("" if s == "passed" else f" {s}") for p, m, s in
                      zip(df.points, df.max_points, df.status)]
        table = df.pivot_table(index="learner", columns="exercise", values="cell", aggfunc="first", sort=False)
        totals = df.groupby("learner", sort=False).agg(points=("points", "sum"), max_points=("max_points", "sum"))
        table["total"] = [f"{p:g}/{m:g}" for p, m in zip(totals.points, totals.max_points)]
        lines = ["# Gradebook", "", table.to_markdown() if _has_tabulate() else table.to_string(), "",
                 "## Why points were lost", ""]
        lost = df[df.status != "passed"]
        lines += [f"- {r.learner}, {r.exercise}: {r.status}. {r.reason}" for r in lost.itertuples()] or ["- none"]
        text = "\n".join(lines) + "\n"
    md_path.write_text(text)
    return csv_path, md_path, text


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401 - pandas' to_markdown needs it
        return True
    except ImportError:
        return False


def grade(submissions: Path, course: Path, cell_timeout: float, learner_timeout: float) -> list[Row]:
    """Autograde every ``submissions/<learner>/NN_topic.ipynb`` of a released lab; returns the rows."""
    released = {p.stem: p.parent.name for p in (course / "source").glob("*/*.ipynb")}
    learners = sorted(p.name for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not learners:
        raise SystemExit(f"grade: no learner folders in {submissions}. HINT: put each learner's notebooks in "
                         f"{submissions}/<learner>/NN_topic.ipynb.")
    graded = {}
    for learner in learners:
        for nb in sorted((submissions / learner).glob("*.ipynb")):
            assignment = released.get(nb.stem)
            if assignment is None or assignment != assignment_name(nb.stem):
                print(f"grade: {learner}/{nb.name} is not a released lab; skipped", file=sys.stderr)
                continue
            dst = course / "submitted" / learner / assignment / nb.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(nb, dst)
            t0 = time.monotonic()
            status, tail = autograde_one(course, assignment, learner, cell_timeout, learner_timeout)
            print(f"graded {learner} {assignment}: {status} ({time.monotonic() - t0:.0f} s)", flush=True)
            graded[(learner, assignment)] = (status, "" if status == "ok" else why_not_graded(status, tail))
    return collect(course, learners, graded)


def run(args) -> int:
    submissions = args.submissions.resolve()
    if not submissions.is_dir():
        raise SystemExit(f"grade: {submissions} is not a folder. HINT: collect the learners' notebooks into "
                         "SUBMISSIONS_DIR/<learner>/NN_topic.ipynb first.")
    for name in ("cell_timeout", "learner_timeout"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"grade: --{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}. "
                             "HINT: e.g. --cell-timeout 300.")
    course = (args.course or submissions.parent).resolve()
    _check_course(course)
    rows = grade(submissions, course, args.cell_timeout, args.learner_timeout)
    csv_path, md_path, text = write_gradebook(rows, course)
    print(text)
    print(f"gradebook: {csv_path} and {md_path}")
    return 0
