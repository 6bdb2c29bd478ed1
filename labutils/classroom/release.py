"""``python -m labutils classroom release [LABS ...] DIR``: the student edition of some or all labs.

    python -m labutils classroom release 03 08 ~/class     # labs 03 and 08
    python -m labutils classroom release ~/class           # every lab

``DIR`` becomes an nbgrader course folder. ``source/labNN/`` holds the instructor's notebook (answers in
nbgrader solution cells, autograded test cells with points), built from ``notebooks/src``; nbgrader's own
``generate_assignment`` writes ``release/labNN/`` (solutions replaced by stubs, test cells locked, outputs
cleared) and the gradebook ``gradebook.db`` that ``classroom grade`` scores submissions against.
``student/`` is what learners get: the released notebooks in ``student/notebooks/``, the recordings the
labs show on machines without GPUs, and the package without ``labutils/solutions`` and without the
instructor's ``release`` and ``grade`` steps (install it with
``pip install -e student``). Release refuses to finish if any file of ``student/`` contains solution text.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]          # labutils/
REPO = PACKAGE.parent
SOLUTIONS = PACKAGE / "solutions"
SOLUTION_MARKERS = ("BEGIN SOLUTION", "END SOLUTION")
IMPORTS_SOLUTIONS = re.compile(r"^\s*(from\s+(labutils|\.+)\.?solutions\b|import\s+labutils\.solutions)", re.M)


class ReleaseError(RuntimeError):
    """The student edition cannot be written (or would carry answers)."""


def add_arguments(parser) -> None:
    parser.add_argument("labs", nargs="*", metavar="LAB",
                        help="labs to release: numbers (3), stems (03_async_p2p) or topics (default: all)")
    parser.add_argument("dir", type=Path, metavar="DIR", help="the course folder to write (nbgrader layout)")


def assignment_name(stem: str) -> str:
    """``03_async_p2p`` -> ``lab03``: the nbgrader assignment of a lab."""
    return f"lab{stem[:2]}"


def _code_lines(text: str) -> list[str]:
    """The stripped code lines of ``text``: no blank lines, comments, docstrings or trailing comments. A
    string constant's lines (``NAME = \"\"\"...``: code held as text, as lab 07's ``%%ranks`` answers) count
    as code."""
    lines, in_doc, in_code = [], False, False
    for raw in text.splitlines():
        line = raw.strip()
        if line.count('"""') == 1 and not in_doc and (in_code or re.match(r"^[A-Z][A-Z0-9_]* = [rf]?\"\"\"", line)):
            in_code = not in_code
            continue
        if line.count('"""') == 1:
            in_doc = not in_doc
            continue
        if in_doc or not line or line.startswith(("#", '"""')):
            continue
        lines.append(line.split("  #")[0].strip())
    return lines


def _without_solution_regions(text: str) -> str:
    return re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", text, flags=re.S)


def _lesson_text(path: Path) -> str:
    """A source's text as a reader sees it: a notebook source's cells (markdown without its ``# ``)."""
    if path.parent.name == "src" and path.parent.parent.name == "notebooks":
        import jupytext
        return "\n".join(c.source for c in jupytext.read(path).cells)
    return path.read_text()


def solution_snippets(solutions_dir: Path = SOLUTIONS, taught: list[Path] | None = None) -> list[str]:
    """What would give an answer away: every two consecutive code lines of a reference solution's body
    (``labutils/solutions/*.py``; signatures and imports left out) that the course does not teach
    anyway -- lesson code in the notebook sources (outside their solution regions) and in ``labs/``."""
    if taught is None:
        taught = sorted((REPO / "notebooks" / "src").glob("*.py")) + sorted((PACKAGE / "labs").rglob("*.py"))
    lesson = "\n".join(ln for p in taught for ln in _code_lines(_without_solution_regions(_lesson_text(p))))
    snippets = set()
    for path in sorted(solutions_dir.glob("lab*.py")):
        body = [ln for ln in _code_lines(path.read_text())
                if not ln.startswith(("import ", "from ", "def ", "class ", "@")) and ln not in ("return", "else:")]
        snippets |= {f"{a}\n{b}" for a, b in zip(body, body[1:]) if len(a) + len(b) >= 30}
    return sorted(s for s in snippets if s not in lesson)


def find_solution_text(root: Path, solutions_dir: Path = SOLUTIONS) -> list[str]:
    """``path: text`` for every file under ``root`` holding two consecutive lines of a reference solution,
    and every notebook holding nbgrader's solution markers."""
    snippets = solution_snippets(solutions_dir)
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".ipynb":  # the notebook's JSON escapes quotes: search its cells' source
            import nbformat
            text = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
            found += [f"{path.relative_to(root)}: {m}" for m in SOLUTION_MARKERS if m in text]
        code = "\n".join(_code_lines(text))
        found += [f"{path.relative_to(root)}: {s!r}" for s in snippets if s in code]
    return found


def instructor_notebook(src: Path, dst: Path) -> None:
    """The instructor's notebook of one lab, without outputs, from its percent-format source."""
    import jupytext
    import nbformat
    nb = jupytext.read(src)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
    if not any(c.get("metadata", {}).get("nbgrader", {}).get("grade") for c in nb.cells):
        raise ReleaseError(f"{src.name} has no autograded test cell (nbgrader grade: true). HINT: mark each "
                           "checker cell of its exercises as CONTRIBUTING.md says, or leave this lab out.")
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)


def student_install(out: Path) -> None:
    """``out``: the package without its reference solutions, what it needs to install, the recordings."""
    if out.exists():
        shutil.rmtree(out)
    instructor_only = {PACKAGE / "solutions", PACKAGE / "classroom" / "release.py", PACKAGE / "classroom" / "grade.py"}

    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or n.endswith(".pyc") or Path(folder) / n in instructor_only]
    shutil.copytree(PACKAGE, out / "labutils", ignore=ignore)
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, out / name)
    if (REPO / "notebooks" / "recorded").is_dir():
        shutil.copytree(REPO / "notebooks" / "recorded", out / "notebooks" / "recorded")


def nbgrader_api(course: Path):
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "gpu-comm-labs"
    config.ClearSolutions.code_stub = {"python": "# ✍ YOUR CODE HERE\nraise NotImplementedError()"}
    return NbGraderAPI(config=config)


def write_config(course: Path) -> None:
    """``nbgrader_config.py``, so that nbgrader's own commands (formgrader, release_assignment) work here."""
    (course / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821 - written by python -m labutils classroom release\n"
        "c.CourseDirectory.course_id = 'gpu-comm-labs'\n"
        "c.ClearSolutions.code_stub = {'python': '# ✍ YOUR CODE HERE\\nraise NotImplementedError()'}\n")


def imports_of_solutions(root: Path, stems: list[str]) -> list[str]:
    """Modules of the released labs under ``root`` (their checker, their ``labs/labNN_*`` package) that
    import the reference solutions: in the student install they would fail."""
    found = []
    for stem in stems:
        files = [root / "labutils" / "checks" / f"lab{stem[:2]}.py"]
        files += sorted((root / "labutils" / "labs").glob(f"lab{stem[:2]}_*/*.py"))
        found += [str(f.relative_to(root)) for f in files if f.exists() and IMPORTS_SOLUTIONS.search(f.read_text())]
    return found


def release(labs: list[str], course: Path) -> list[Path]:
    """Write the instructor's and the student's editions of ``labs`` into ``course``; returns the student
    notebooks.

    Raises:
        ReleaseError: nbgrader failed, a lab has no test cell, or the student edition holds solution text.
    """
    from ..commands.run_labs import UnknownLab, find_labs, notebooks_dir
    course = course.resolve()
    if course.exists() and not course.is_dir():
        raise ReleaseError(f"{course} is a file. HINT: give a folder for the course (it is created if missing).")
    try:
        paths = find_labs(notebooks_dir(), labs)
    except UnknownLab as exc:
        raise ReleaseError(str(exc)) from None
    course.mkdir(parents=True, exist_ok=True)
    write_config(course)
    student = course / "student"
    student_install(student)
    api = nbgrader_api(course)
    written = []
    for nb_path in paths:
        src = nb_path.parent / "src" / f"{nb_path.stem}.py"
        name = assignment_name(nb_path.stem)
        instructor_notebook(src if src.exists() else nb_path, course / "source" / name / f"{nb_path.stem}.ipynb")
        result = api.generate_assignment(name, force=True)
        if not result["success"]:
            raise ReleaseError(f"nbgrader generate_assignment {name} failed: {result['error'] or result['log']}"
                               " HINT: read nbgrader's log above; a cell with BEGIN SOLUTION needs its END.")
        released = course / "release" / name / f"{nb_path.stem}.ipynb"
        (student / "notebooks").mkdir(parents=True, exist_ok=True)
        shutil.copy2(released, student / "notebooks" / released.name)
        written.append(student / "notebooks" / released.name)
    imports = imports_of_solutions(student, [p.stem for p in paths])
    if imports:
        raise ReleaseError(f"in the student install these modules import the reference solutions, which it does "
                           f"not carry: {', '.join(imports)}. HINT: a checker returns a stand-in (torch's "
                           "collective, a recorded result) for an exercise not attempted, never the answer.")
    leaks = find_solution_text(student)
    if leaks:
        raise ReleaseError(f"the student edition would carry solution text: {'; '.join(leaks[:5])}"
                           f"{' ...' if len(leaks) > 5 else ''}. HINT: put every answer between ### BEGIN "
                           "SOLUTION and ### END SOLUTION in its notebook, and keep checkers from importing "
                           "labutils.solutions.")
    return written


def run(args) -> int:
    try:
        notebooks = release(args.labs, args.dir)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    course = args.dir.resolve()
    print(f"released {len(notebooks)} lab(s) into {course}:")
    for nb in notebooks:
        print(f"  {nb.relative_to(course)}")
    print(f"hand out {course / 'student'} (learners: pip install -e student, then open student/notebooks);\n"
          f"collect each learner's notebooks into SUBMISSIONS/<learner>/ and run:\n"
          f"  python -m labutils classroom grade SUBMISSIONS --course {course}")
    return 0

