"""Fetch the slide decks' front-end assets once, at set-up time, so `m11 slides` never needs a network.

    .venv/bin/python -m m11_helpers.tools.assets [--force] [--optional]

`--optional` is what set-up (`make lab`, `make test`) runs: without npm, or without a network, it
prints what the decks then need and exits 0, so JupyterLab, the lessons and the tests still work;
`m11 slides --cdn` builds decks that load the same versions from a CDN instead.

Each npm package is fetched with `npm pack` (a tarball, no node_modules) and only the files a deck
loads are kept: reveal.js (CSS, UMD bundle, themes with their local fonts, notes plugin), MathJax 3
(one combined TeX+CHTML bundle and its woff fonts) and require.js. About 5 MB in all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# reveal.js 5 keeps the 4.x layout nbconvert's reveal template loads (dist/reveal.js as UMD for
# require.js, dist/theme/*.css, plugin/notes/notes.js); 6.x is newer than anything nbconvert targets.
# MathJax 3 rather than 2: two files plus fonts instead of hundreds of lazily loaded ones; our
# template (templates/m11_reveal) configures it instead of the MathJax 2 `Hub` API.
PACKAGES: dict[str, str] = {"reveal.js": "5.2.1", "mathjax": "3.2.2", "requirejs": "2.3.8"}

# package -> (folder in the cache, paths inside the tarball's `package/` to keep)
KEEP: dict[str, tuple[str, list[str]]] = {
    "reveal.js": ("reveal.js", ["LICENSE", "dist/reveal.css", "dist/reset.css", "dist/reveal.js",
                                "dist/theme", "plugin/notes/notes.js"]),
    "mathjax": ("mathjax", ["LICENSE", "es5/tex-chtml-full.js", "es5/output/chtml/fonts/woff-v2"]),
    "requirejs": ("require.js", ["require.js"]),
}
STAMP = "VERSIONS.json"
# a CSS url() or @import whose target is another host
REMOTE_CSS = re.compile(r"""(?:url\(|@import)\s*['"]?\s*(?:https?:)?//""", re.I)


def assets_dir() -> Path:
    """The asset cache: $M11_ASSETS, else <sys.prefix>/share/m11-assets (inside the venv)."""
    env = os.environ.get("M11_ASSETS")
    return Path(env).expanduser() if env else Path(sys.prefix) / "share" / "m11-assets"


def installed(cache: Path | None = None) -> bool:
    """True when the cache holds exactly the pinned versions."""
    stamp = (cache or assets_dir()) / STAMP
    try:
        return json.loads(stamp.read_text()) == PACKAGES
    except (OSError, ValueError):
        return False


def assets_hint() -> str | None:
    """None when the offline slide assets are installed, else the command that installs them."""
    return None if installed() else (f"missing: run `{fetch_command()}` (into {assets_dir()}; needs npm), "
                                     "or build decks with `m11 slides --cdn`")


def fetch_command() -> str:
    """The command that fills the cache, with this interpreter (a venv's, or a pip install's python)."""
    return f"{sys.executable} -m m11_helpers.tools.assets"


class NpmMissing(RuntimeError):
    """npm is not on PATH: offline slide assets cannot be fetched (nothing else needs npm)."""


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise NpmMissing(
            "npm was not found, and it is needed once to fetch reveal.js, MathJax and require.js "
            "for offline slides. Install Node.js (which brings npm): `sudo apt-get install -y npm` "
            "on Debian/Ubuntu, `brew install node` on macOS, or https://nodejs.org; then rerun "
            f"`{fetch_command()}`. Until then `m11 slides --cdn` builds decks that load them from a CDN."
        )
    return npm


def _fetch(name: str, version: str, tmp: Path, dest: Path) -> None:
    """`npm pack` one package into tmp and copy the kept files into dest."""
    out = subprocess.run([_npm(), "pack", f"{name}@{version}", "--silent"], cwd=tmp,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"npm pack {name}@{version} failed:\n{out.stderr.strip()}")
    tarball = tmp / out.stdout.strip().splitlines()[-1]
    unpacked = tmp / f"{name}-unpacked"
    extract(tarball, unpacked)
    folder, keep = KEEP[name]
    for rel in keep:
        # MathJax's es5/ prefix is dropped; reveal.js keeps its layout, which the template hard-codes
        src, dst = unpacked / "package" / rel, dest / folder / rel.removeprefix("es5/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    if name == "reveal.js":
        _drop_remote_themes(dest / folder / "dist" / "theme")


def extract(tarball: Path, dest: Path) -> None:
    """Unpack `tarball` into `dest`, refusing what could land outside it (absolute paths, `..`, links, devices).

    The "data" filter does exactly that; Python 3.10.0-3.10.11 (the floor is 3.10) has no `filter=`
    (a TypeError): there, regular files and folders are checked and extracted one by one, the rest skipped.
    """
    with tarfile.open(tarball) as tar:
        if hasattr(tarfile, "data_filter"):  # the documented test for filter support
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not (member.isfile() or member.isdir()) or os.path.isabs(member.name) or \
                    (target != root and root not in target.parents):
                continue  # npm tarballs hold plain files; anything else has no business in a deck
            # as the data filter does: no setuid/setgid/sticky or group/other write bits; owned by us
            member.mode = 0o755 if member.isdir() else (member.mode & 0o755) | 0o600
            member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
            tar.extract(member, dest)


def _drop_remote_themes(theme_dir: Path) -> None:
    """Delete the themes that @import Google Fonts: a deck using one would not be offline."""
    for css in theme_dir.glob("*.css"):
        if REMOTE_CSS.search(css.read_text(encoding="utf-8")):
            css.unlink()


def fetch_assets(cache: Path | None = None, force: bool = False) -> Path:
    """Fill the cache (skipped when the version stamp matches, unless force) and return it."""
    cache = cache or assets_dir()
    if installed(cache) and not force:
        return cache
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        staging = tmp / "assets"  # built aside, then swapped in: a failed fetch leaves no half cache
        for name, version in PACKAGES.items():
            _fetch(name, version, tmp, staging)
        (staging / STAMP).write_text(json.dumps(PACKAGES, indent=1))
        if cache.exists():
            shutil.rmtree(cache)
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, cache)
    return cache


def size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    """0 when the assets are there (or, with --optional, could not be fetched); 1 on a failed fetch; 2 on usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in argv if a not in ("--force", "--optional")]
    if unknown:
        print(f"usage: python -m m11_helpers.tools.assets [--force] [--optional]  (unknown: {' '.join(unknown)})",
              file=sys.stderr)
        return 2
    was = installed()
    try:
        cache = fetch_assets(force="--force" in argv)
    except RuntimeError as err:
        if "--optional" not in argv:
            print(f"m11 assets: {err}", file=sys.stderr)
            return 1
        # set-up goes on: JupyterLab, the lessons, the tests and CDN decks need no assets
        why = "npm is not installed" if isinstance(err, NpmMissing) else "fetching them failed"
        print(f"slide assets skipped ({why}); everything but offline decks works without them.\n  {err}")
        return 0
    state = "already present" if was and "--force" not in argv else "fetched"
    versions = ", ".join(f"{k} {v}" for k, v in PACKAGES.items())
    print(f"slide assets {state}: {cache} ({versions}; {size_bytes(cache) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
