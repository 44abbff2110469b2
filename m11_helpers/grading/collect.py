"""Collect a class's submissions as they stood at the deadline: one folder per student, and a manifest.

    collect_classroom(assignment_id, deadline, out)   # GitHub Classroom roster through `gh` (GH_TOKEN)
    collect_export(path, deadline, out)               # an LMS export: a .zip or a folder

Both write `out/<student>/…` (the files of the submission, never `.git`) and `out/manifest.csv`:
student, origin, commit (the graded one), head (the newest), late, deadline, collected, notes. From GitHub the graded
commit is `git rev-list -1 --before=DEADLINE HEAD`; `late` says that commits after it exist and were not
graded. Commit dates come from the student's clock: for a dispute, compare with the push times GitHub
keeps (`gh api repos/OWNER/REPO/activity`). An export is taken as the LMS delivered it: a folder per
student, or Canvas's flat `name_[LATE_]userid_subid_file` names (`late` from its LATE marker).
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["MANIFEST", "parse_deadline", "collect_classroom", "collect_export", "read_manifest", "safe_name"]

MANIFEST = "manifest.csv"
FIELDS = ["student", "origin", "commit", "head", "late", "deadline", "collected", "notes"]
MAX_FILE, MAX_TOTAL = 50 << 20, 1 << 30  # a submission is notebooks: anything bigger is not one
_CANVAS = re.compile(r"^(?P<student>[^_/]+)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")


def parse_deadline(text: str) -> datetime:
    """An ISO 8601 deadline with its time zone (e.g. 2025-03-14T23:59:00Z), as an aware datetime."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"deadline={text!r}: expected ISO 8601 with a time zone, e.g. 2025-03-14T23:59:00Z") from None
    if when.tzinfo is None:
        raise ValueError(f"deadline={text!r}: give the time zone (Z or +01:00): runners run in UTC")
    return when


def safe_name(name: str) -> str:
    """A student's name as a folder name: letters, digits, `.-+@` and `_` only, never `..`."""
    cleaned = re.sub(r"[^\w.+@-]+", "_", name.strip()).strip("._") or "unnamed"
    return cleaned[:100]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_manifest(rows: list[dict], out: Path) -> Path:
    with open(out / MANIFEST, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: r["student"]))
    return out / MANIFEST


def read_manifest(folder: Path) -> dict[str, dict]:
    """The manifest's rows by student ({} when the folder has none, e.g. a hand-made class folder)."""
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          timeout=300).stdout.strip()


def _roster(assignment_id: str) -> list[tuple[str, str]]:
    """(student, owner/repo) of every accepted assignment, from GitHub Classroom's REST API."""
    out = subprocess.run(["gh", "api", "--paginate", f"/assignments/{assignment_id}/accepted_assignments"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"gh api /assignments/{assignment_id}/accepted_assignments failed (is GH_TOKEN a "
                           f"classroom administrator's token?): {out.stderr.strip()[:500]}")
    pages, text, decoder = [], out.stdout.strip(), json.JSONDecoder()
    while text:  # --paginate prints one JSON array per page, back to back
        page, end = decoder.raw_decode(text)
        pages += page
        text = text[end:].strip()
    return [("+".join(s["login"] for s in a["students"]), a["repository"]["full_name"]) for a in pages]


def _export_commit(repo: Path, commit: str, dest: Path) -> None:
    """Write the regular files of `commit` (not symlinks, submodules or .github) into dest, size-capped."""
    total = 0
    for entry in _git(repo, "ls-tree", "-r", "-z", "--long", commit).split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, sha, size = meta.split()
        if kind != "blob" or mode not in ("100644", "100755") or path.startswith(".github/"):
            continue
        total += int(size)
        if int(size) > MAX_FILE or total > MAX_TOTAL:
            continue
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "-C", str(repo), "cat-file", "blob", sha], capture_output=True,
                                          check=True, timeout=60).stdout)


def _collect_one(student: str, full_name: str, deadline: datetime, out: Path) -> dict:
    name = safe_name(student)
    row = {"student": name, "origin": f"https://github.com/{full_name}", "commit": "", "head": "", "late": "",
           "deadline": deadline.isoformat(), "collected": _now(), "notes": ""}
    (out / name).mkdir(parents=True, exist_ok=True)  # an empty folder still gets its row: "missing"
    with tempfile.TemporaryDirectory(prefix="m11-collect-") as tmp:
        clone = Path(tmp) / "repo"
        done = subprocess.run(["gh", "repo", "clone", full_name, str(clone), "--", "--quiet"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return dict(row, notes=f"not collected: {' '.join(done.stderr.split())[:200]}")
        head = _git(clone, "rev-parse", "HEAD")
        graded = _git(clone, "rev-list", "-1", f"--before={deadline.isoformat()}", "HEAD")
        row.update(head=head, commit=graded, late="yes" if graded != head else "no")
        if not graded:
            return dict(row, notes="no commit before the deadline")
        _export_commit(clone, graded, out / name)
    return row


def collect_classroom(assignment_id: str, deadline: datetime, out: Path, workers: int = 8) -> list[dict]:
    """Clone each student's repository (`workers` at a time), take the newest commit at or before the deadline."""
    out.mkdir(parents=True, exist_ok=True)
    roster = _roster(assignment_id)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(lambda sr: _collect_one(sr[0], sr[1], deadline, out), roster))
    _write_manifest(rows, out)
    return rows


def _unzip(archive: Path, dest: Path) -> Path:
    """Extract an export safely: no absolute or `..` paths (zipfile drops them), no links, size-capped."""
    with zipfile.ZipFile(archive) as z:
        members = [m for m in z.infolist() if not m.is_dir() and (m.external_attr >> 16) & 0o170000 != 0o120000]
        if sum(m.file_size for m in members) > MAX_TOTAL * 4:
            raise ValueError(f"export={str(archive)!r}: over {MAX_TOTAL * 4 >> 30} GiB unpacked; refusing")
        for m in members:
            z.extract(m, dest)
    entries = [p for p in dest.iterdir() if not p.name.startswith(("__MACOSX", "."))]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest  # a zip of one folder


def collect_export(export: Path, deadline: datetime | None, out: Path) -> list[dict]:
    """Turn an LMS export (folder or .zip) into one folder per student plus the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="m11-export-") as tmp:
        root = _unzip(export, Path(tmp)) if export.is_file() and zipfile.is_zipfile(export) else export
        if not root.is_dir():
            raise ValueError(f"export={str(export)!r}: not a folder or a .zip file")
        rows: dict[str, dict] = {}
        for entry in sorted(root.iterdir()):
            if entry.name.startswith(".") or entry.is_symlink() or entry.name == MANIFEST:
                continue
            match = _CANVAS.match(entry.name) if entry.is_file() else None
            student = safe_name(match["student"] if match else entry.name if entry.is_dir() else entry.stem)
            row = rows.setdefault(student, {"student": student, "origin": f"export:{export.name}", "commit": "",
                                            "head": "", "late": "no" if match else "", "collected": _now()})
            if match and match["late"]:
                row["late"] = "yes"
            target = out / student
            target.mkdir(parents=True, exist_ok=True)
            if entry.is_dir():
                shutil.copytree(entry, target, dirs_exist_ok=True, symlinks=True,
                                ignore=shutil.ignore_patterns(".git", "__MACOSX"))
            elif entry.stat().st_size <= MAX_FILE:
                shutil.copyfile(entry, target / (match["file"] if match else entry.name))
    for row in rows.values():  # the LMS already cut the export at its deadline: recorded, not applied
        row["deadline"] = deadline.isoformat() if deadline else ""
    _write_manifest(list(rows.values()), out)
    return list(rows.values())
