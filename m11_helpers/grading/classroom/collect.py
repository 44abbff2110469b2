"""Collect a class's submissions as they stood at the deadline: one folder per student, and a manifest.

    collect_classroom(assignment_id, deadline, out)   # GitHub Classroom roster through `gh` (GH_TOKEN)
    collect_export(path, deadline, out)               # an LMS export: a .zip or a folder

Both write `out/<student>/…` (the files of the submission, never `.git` or a symbolic link) and
`out/manifest.csv`: student, origin, commit (the graded one), dated, head (the newest), late, deadline,
collected, notes.

From GitHub the graded commit is the head of the last push before the deadline, from GitHub's own push
records (`gh api repos/OWNER/REPO/activity`: each push, force-push or merge with its time and the new
head), never from commit dates, which the student's clock sets: a commit made after the deadline and
back-dated is not graded, and a force-push after it cannot change what a later re-collection grades.
`late` says that pushes came after the deadline. `dated` is what commit dates alone would pick
(`git rev-list -1 --before=DEADLINE HEAD`); when it differs from the graded commit the notes say so (a
back-dated commit). Only where GitHub's records cannot be read does the commit-date method decide, and
the notes say that too. An export is taken as the LMS delivered it (its own clock): a folder per
student, or Canvas's flat `name_[LATE_]userid_subid_file` names (`late` from its LATE marker).
"""

from __future__ import annotations

import csv
import json
import os
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
FIELDS = ["student", "origin", "commit", "dated", "head", "late", "deadline", "collected", "notes"]
PUSHES = {"push", "force_push", "pr_merge", "merge_queue_merge", "branch_creation"}  # what moves a branch's head
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


def _gh_pages(path: str) -> list:
    """Every item of a paginated GitHub API list (`gh api --paginate`); RuntimeError with gh's words."""
    out = subprocess.run(["gh", "api", "--paginate", path], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"gh api {path} failed: {' '.join(out.stderr.split())[:500]}")
    pages, text, decoder = [], out.stdout.strip(), json.JSONDecoder()
    while text:  # --paginate prints one JSON array per page, back to back
        page, end = decoder.raw_decode(text)
        pages += page
        text = text[end:].strip()
    return pages


def _roster(assignment_id: str) -> list[tuple[str, str]]:
    """(student, owner/repo) of every accepted assignment, from GitHub Classroom's REST API."""
    try:
        pages = _gh_pages(f"/assignments/{assignment_id}/accepted_assignments")
    except RuntimeError as e:
        raise RuntimeError(f"{e} (is GH_TOKEN a classroom administrator's token?)") from None
    return [("+".join(s["login"] for s in a["students"]), a["repository"]["full_name"]) for a in pages]


def _pushes(full_name: str, branch: str) -> list[tuple[datetime, str]]:
    """(time, new head) of every push to `branch`, oldest first, from GitHub's records (not commit dates)."""
    events = _gh_pages(f"repos/{full_name}/activity?ref=refs/heads/{branch}&per_page=100")
    return sorted((parse_deadline(e["timestamp"]), e["after"]) for e in events
                  if e.get("activity_type") in PUSHES and e.get("after", "").strip("0"))


def _at_deadline(clone: Path, full_name: str, deadline: datetime) -> tuple[str, str, str, list[str]]:
    """(graded commit, dated, late, notes): the head of the last push before the deadline, by GitHub's records."""
    dated = _git(clone, "rev-list", "-1", f"--before={deadline.isoformat()}", "HEAD")
    try:
        pushes = _pushes(full_name, _git(clone, "rev-parse", "--abbrev-ref", "HEAD"))
    except RuntimeError as e:  # no records to read: the student's clock decides, and the row says so
        late = "yes" if dated != _git(clone, "rev-parse", "HEAD") else "no"
        return dated, dated, late, [f"GitHub's push records could not be read ({e}): graded by commit dates, which the "
                             "student's clock sets"]
    graded = next((sha for when, sha in reversed(pushes) if when <= deadline), "")
    late, notes = "yes" if any(when > deadline for when, _ in pushes) else "no", []
    if graded and subprocess.run(["git", "-C", str(clone), "cat-file", "-e", f"{graded}^{{commit}}"]).returncode:
        subprocess.run(["git", "-C", str(clone), "fetch", "--quiet", "origin", graded], capture_output=True, timeout=300)
    if graded and subprocess.run(["git", "-C", str(clone), "cat-file", "-e", f"{graded}^{{commit}}"]).returncode:
        return "", dated, late, [f"the commit pushed before the deadline ({graded[:10]}) is gone from the repository "
                          "(history rewritten after it): not graded"]
    if graded != dated:
        notes.append(f"commit dates disagree with GitHub's push records: graded {graded[:10] or 'nothing'} (pushed "
                     f"before the deadline), not {dated[:10] or 'nothing'} (dated before it: back-dated?)")
    return graded, dated, late, notes


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
    row = {"student": name, "origin": f"https://github.com/{full_name}", "commit": "", "dated": "", "head": "",
           "late": "", "deadline": deadline.isoformat(), "collected": _now(), "notes": ""}
    (out / name).mkdir(parents=True, exist_ok=True)  # an empty folder still gets its row: "missing"
    with tempfile.TemporaryDirectory(prefix="m11-collect-") as tmp:
        clone = Path(tmp) / "repo"
        done = subprocess.run(["gh", "repo", "clone", full_name, str(clone), "--", "--quiet"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return dict(row, notes=f"not collected: {' '.join(done.stderr.split())[:200]}")
        graded, dated, late, notes = _at_deadline(clone, full_name, deadline)
        row.update(head=_git(clone, "rev-parse", "HEAD"), commit=graded, dated=dated, late=late, notes="; ".join(notes))
        if not graded:
            return dict(row, notes="; ".join(notes or ["no push before the deadline"]))
        _export_commit(clone, graded, out / name)
    return row


def collect_classroom(assignment_id: str, deadline: datetime, out: Path, workers: int = 8) -> list[dict]:
    """Clone each student's repository (`workers` at a time), take the head of its last push before the deadline."""
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


def _no_links(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n in (".git", "__MACOSX") or os.path.islink(os.path.join(folder, n))]


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
                                            "dated": "", "head": "", "late": "no" if match else "",
                                            "collected": _now()})
            if match and match["late"]:
                row["late"] = "yes"
            target = out / student
            target.mkdir(parents=True, exist_ok=True)
            if entry.is_dir():  # never a link: the grader would read what it points at as this student's work
                shutil.copytree(entry, target, dirs_exist_ok=True, ignore=_no_links)
            elif entry.stat().st_size <= MAX_FILE:
                shutil.copyfile(entry, target / (match["file"] if match else entry.name))
    for row in rows.values():  # the LMS already cut the export at its deadline: recorded, not applied
        row["deadline"] = deadline.isoformat() if deadline else ""
    _write_manifest(list(rows.values()), out)
    return list(rows.values())
