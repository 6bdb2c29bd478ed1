"""``python -m labutils workspace [DIR]``: your own working copy of the labs, to edit and run.

    python -m labutils workspace                 # copies the labs into ./my-labs
    jupyter lab my-labs                          # open them there (as root: --allow-root)
    python -m labutils workspace                 # any day after: adds what is new, keeps your changes
    python -m labutils run-labs --dir my-labs    # run the copies headless

The committed notebooks (``notebooks/NN_*.ipynb``) carry the reference outputs and stay as they are;
JupyterLab's autosave and your edits only ever touch the copies. What a lab needs to run from the copy
comes along: the recordings (``recorded/``, found by ``labutils.recorded`` beside the notebook).
The copies keep the reference outputs, so a lab reads complete before you run it, and are marked
trusted (as ``jupyter trust`` does) so that their saved widgets and tables render.

``DIR/.labs-workspace.json`` remembers what each copy was when it was made: a copy that still matches
is yours untouched (refreshed when the course changes), one that does not is edited (or run) and is
kept -- the command says so and succeeds, so ``workspace && jupyter lab`` works every day -- unless
``--force`` replaces it. A notebook's content is its cells (source and outputs): JupyterLab
rewriting its metadata when a kernel starts does not make it edited. ``DIR/.gitignore`` keeps the
folder out of git wherever it lies.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import sys
from pathlib import Path

MANIFEST = ".labs-workspace.json"
GITIGNORE_TEXT = ("# made by `python -m labutils workspace`: keeps your working copies out of git.\n"
                  "# Delete this file if you want to version them yourself.\n*\n")
DEFAULT_DIR = "my-labs"


class WorkspaceError(Exception):
    """The workspace cannot be made as asked; the message says why and what to do instead."""


def course_notebooks() -> Path:
    """The course's committed notebooks: ``notebooks/`` beside the ``labutils`` package."""
    src = Path(__file__).resolve().parents[2] / "notebooks"
    if not any(src.glob("[0-9][0-9]_*.ipynb")):
        raise WorkspaceError(f"no lab notebooks in {src}. HINT: labutils must be installed from a clone of "
                             f"the course (`pip install -e .` in it, as requirements.txt does).")
    return src


def course_files(src: Path) -> list[str]:
    """Paths, relative to ``src``, of what a workspace holds: the labs and their recordings."""
    files = [p.name for p in sorted(src.glob("[0-9][0-9]_*.ipynb"))]
    files += [f"recorded/{p.name}" for p in sorted((src / "recorded").glob("*.json"))]
    return files


def _joined(x):
    """Multi-line strings as one string, whether a file stores them as one or as a list of lines."""
    if isinstance(x, list):
        return "".join(x) if all(isinstance(v, str) for v in x) else [_joined(v) for v in x]
    return {k: _joined(v) for k, v in x.items()} if isinstance(x, dict) else x


def fingerprint(path: Path) -> str:
    """sha256 of what a learner would call the file's content.

    For a notebook: its cells' type, source and outputs. JupyterLab rewrites a notebook's metadata
    as soon as a kernel starts (Python version, kernel display name, widget numbers) and then
    autosaves it: a copy that was only opened is not an edited one.
    """
    data = path.read_bytes()
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(data)["cells"]
            data = json.dumps([[c.get("cell_type"), _joined(c.get("source", "")), _joined(c.get("outputs", []))]
                               for c in cells], sort_keys=True).encode()
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not a readable notebook: its bytes are its content
    return hashlib.sha256(data).hexdigest()


def _read_manifest(dest: Path) -> dict[str, str] | None:
    path = dest / MANIFEST
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError(f"'files' is a {type(files).__name__}")
    except (ValueError, KeyError, TypeError) as exc:
        raise WorkspaceError(f"{path} is damaged ({exc}), so which copies you edited is unknown. "
                             f"HINT: `--force` copies the labs afresh (edits in DIR are lost), or "
                             f"choose another DIR.") from None
    return files


def plan(src: Path, dest: Path) -> dict[str, list[str]]:
    """Sort the course's files by what a copy into ``dest`` would do to them (pure: changes nothing).

    Returns ``{"new": [...], "same": [...], "outdated": [...], "edited": [...]}``: missing in ``dest``;
    identical to the course's; an untouched copy of an older version; changed since it was copied.
    """
    manifest = _read_manifest(dest) or {}
    out: dict[str, list[str]] = {"new": [], "same": [], "outdated": [], "edited": []}
    for rel in course_files(src):
        target = dest / rel
        if not target.exists():
            out["new"].append(rel)
            continue
        have = fingerprint(target)
        if have == fingerprint(src / rel):
            out["same"].append(rel)
        elif have == manifest.get(rel):
            out["outdated"].append(rel)
        else:
            out["edited"].append(rel)
    return out


def _check_destination(src: Path, dest: Path, force: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise WorkspaceError(f"{dest} is a file, not a folder. HINT: choose another DIR.")
    src_r, dest_r = src.resolve(), dest.resolve()
    if dest_r == src_r or src_r in dest_r.parents or dest_r in src_r.parents:
        raise WorkspaceError(f"{dest} holds or lies inside the course's notebooks ({src}); the workspace "
                             f"must be apart from them. HINT: use the default ./{DEFAULT_DIR} or another "
                             f"new folder.")
    if (dest.is_dir() and not force and not (dest / MANIFEST).exists()
            and any(p.name != ".ipynb_checkpoints" for p in dest.iterdir())):
        raise WorkspaceError(f"{dest} is not empty and is not a labs workspace (it has no {MANIFEST}). "
                             f"HINT: choose a new or empty DIR, or `--force` to copy the labs into it "
                             f"anyway.")


def _trust(paths: list[Path]) -> str:
    """Mark notebooks trusted, as ``jupyter trust`` does; returns '' or why it could not."""
    try:
        import nbformat
        from nbformat.sign import NotebookNotary
        notary = NotebookNotary()
        for path in paths:
            notary.sign(nbformat.read(path, as_version=4))
    except Exception as exc:  # noqa: BLE001 - trust only lets saved widgets render; the copy is made
        return f"{type(exc).__name__}: {exc}"
    return ""


def make_workspace(dest: Path, *, force: bool = False, src: Path | None = None) -> dict[str, list[str]]:
    """Copy the labs and their recordings from ``src`` (the course's ``notebooks/``) into ``dest``.

    New files are copied and untouched older copies refreshed. An edited copy is kept, or overwritten
    with ``force``.
    Returns ``plan``'s dict plus ``"copied"`` (what was written) and ``"trust_error"`` ([] or [why]).

    Raises:
        WorkspaceError: ``dest`` is a file, overlaps the course's notebooks, is an unrelated non-empty
            folder, or its manifest is damaged.
    """
    src = src or course_notebooks()
    dest = Path(dest)
    _check_destination(src, dest, force)
    if force and (dest / MANIFEST).exists():
        try:
            _read_manifest(dest)
        except WorkspaceError:
            (dest / MANIFEST).unlink()  # --force starts afresh; every file is overwritten below
    todo = plan(src, dest)
    copy = todo["new"] + todo["outdated"] + (todo["edited"] if force else [])
    (dest / "recorded").mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(dest) or {}
    for rel in copy:
        shutil.copyfile(src / rel, dest / rel)  # a new file: never a link to the committed one
    for rel in copy + todo["same"]:
        manifest[rel] = fingerprint(dest / rel)
    (dest / MANIFEST).write_text(json.dumps({"files": manifest}, indent=1, sort_keys=True) + "\n")
    if not (dest / ".gitignore").exists():
        (dest / ".gitignore").write_text(GITIGNORE_TEXT)
    why = _trust([dest / rel for rel in copy + todo["same"] if rel.endswith(".ipynb")])
    return {**todo, "copied": copy, "trust_error": [why] if why else []}


def report(dest_arg: str, result: dict[str, list[str]], force: bool = False) -> str:
    """What ``make_workspace`` did, and how to open the labs (pure)."""
    labs = [r for r in result["copied"] if r.endswith(".ipynb")]
    recs = len(result["copied"]) - len(labs)
    lines = [f"Workspace {dest_arg}: " + (f"copied {len(labs)} lab(s) and {recs} recording(s)"
                                          if result["copied"] else "up to date") + "."]
    if labs:
        lines.append("  " + " ".join(Path(r).stem for r in labs))
    if result["edited"] and not force:
        lines.append("Kept your changed copies (edited or run; the course's version may be newer, "
                     f"`--force` replaces them): " + ", ".join(result["edited"]))
    if result["edited"] and force:
        lines.append("Overwrote your edited copies: " + ", ".join(result["edited"]))
    if result["trust_error"]:
        lines.append(f"Note: could not mark the copies trusted ({result['trust_error'][0]}); saved widgets "
                     f"show as text until a cell runs. HINT: `jupyter trust {shlex.quote(dest_arg)}/*.ipynb`.")
    lines += ["", "Open the labs with:", f"  jupyter lab {shlex.quote(dest_arg)}",
              "  (as root, e.g. in a container: add --allow-root)", "",
              "Your changes stay in this folder; notebooks/ keeps the reference outputs. Run this command "
              "again any day: it adds what is new in the course and keeps your changes."]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("dir", nargs="?", default=DEFAULT_DIR,
                        help=f"the working folder (default ./{DEFAULT_DIR}, ignored by git)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--update", action="store_true",  # what it always does now; older notes say it
                       help=argparse.SUPPRESS)
    group.add_argument("--force", action="store_true",
                       help="overwrite every copy, also those you changed (your changes are lost); by default "
                            "new labs are added, untouched copies refreshed and changed ones kept")


def run(args) -> int:
    try:
        result = make_workspace(Path(args.dir), force=args.force)
    except WorkspaceError as exc:
        print(f"python -m labutils workspace: {exc}", file=sys.stderr)
        return 1
    print(report(args.dir, result, args.force))
    return 0
