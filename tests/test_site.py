"""The course site (`m11 site`), built once from this session's executed notebooks, read as a visitor would.

The build (tools/course_site.py) takes the copies the course-notebook run kept (build/test-artifacts/executed,
tests/conftest.py) where they are complete and current, so nothing is executed again; the scheduler keeps
this file in the course unit, after the notebooks (`after_course`). One build (~20 s on 2 cores), then:

1. In headless Chromium, served from 127.0.0.1 with every other host unresolvable: every page loads
   and asks nothing outside the site; the search page finds a word that only lesson 12 uses and links
   to it; a formula is typeset by the local MathJax; lesson 02's plots are drawn (when this session, or a
   fresh earlier one, executed it); on no page is content cut at the right edge — proven able to fail
   on a page given one unwrapped 400-character line.
2. Without a browser: no solution or hidden-test region of solutions/, no wrong answer and no speaker
   note appears in any built page or the search index — proven able to fail on a page that has one.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest

from m11_helpers.tools.assets import assets_dir, installed
from m11_helpers.tools.site_pages import instructor_regions, leaks, page_text, words
from support.browser import Chromium, find_chromium, free_port, wait_for

pytest.importorskip("myst_nb", reason="the site tools are the [site] extra: pip install -e '.[site]'")

REPO = Path(__file__).resolve().parents[1]
EXECUTED = REPO / "build" / "test-artifacts" / "executed"
SHOTS = REPO / "build" / "test-artifacts" / "site"
PAGES = REPO / "m11_helpers" / "tools" / "templates" / "site" / "github-pages.yml"

# every element of the page's body whose right edge is past the viewport and that no scrolling box holds
CUT = """((extra) => {
  if (extra) document.querySelector('div.body').insertAdjacentHTML('beforeend',
      '<pre style="white-space: pre; overflow: visible">' + 'x'.repeat(400) + '</pre>');
  const W = document.documentElement.clientWidth, cut = [];
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  if (document.documentElement.scrollWidth > W + 1) cut.push(['the page scrolls sideways', document.documentElement.scrollWidth, W]);
  for (const e of document.querySelectorAll('div.body *')) {
    const r = e.getBoundingClientRect();
    if (!r.width || r.right <= W + 1) continue;
    let box = e.parentElement;
    while (box && !scrolls(box)) box = box.parentElement;
    if (!box || box.getBoundingClientRect().right > W + 1) cut.push([e.tagName, Math.round(r.right), W, (e.innerText || '').slice(0, 60)]);
  }
  return cut.slice(0, 5);
})(%s)"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from m11_helpers.tools.course_site import build_site

    if not installed(assets_dir()):
        pytest.skip(f"no offline assets (MathJax) in {assets_dir()}: run `python -m m11_helpers.tools.assets`")
    out = tmp_path_factory.mktemp("site") / "site"
    lessons = build_site(REPO, EXECUTED, out)
    return out, lessons


def test_pages_workflow_executes_the_lessons_builds_the_site_and_deploys_it() -> None:
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(PAGES.read_text())
    steps = wf["jobs"]["build"]["steps"]
    runs = [s.get("run", "") for s in steps]
    order = [next(i for i, r in enumerate(runs) if cmd in r) for cmd in ("[site]", "m11 course", "m11 site")]
    assert order == sorted(order) and "--executed build/executed --out build/site" in runs[order[2]]
    assert "download.pytorch.org/whl/cpu" in runs[order[0]] and "m11_helpers.tools.assets" in runs[order[0]]
    (upload,) = [s for s in steps if "upload-pages-artifact" in s.get("uses", "")]
    assert upload["with"]["path"] == "build/site"
    assert "deploy-pages" in str(wf["jobs"]["deploy"]) and wf["jobs"]["deploy"]["needs"] == "build"
    assert wf["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}


@pytest.mark.slow
@pytest.mark.after_course
def test_no_instructor_text_reaches_the_site(site, tmp_path: Path) -> None:
    out, _ = site
    regions = instructor_regions(REPO / "solutions", REPO / "course")
    assert sum(" solution " in k for k in regions) >= 13 and any(" hidden tests " in k for k in regions), list(regions)[:5]
    assert any("speaker notes" in k for k in regions) and any(k.startswith("wrong_answers/") for k in regions)
    # what the site may show: the exercise statements and the lessons' own cells (a lesson teaches code a
    # solution then reuses, `buf = torch.empty_like(chunks[0])`), never their speaker notes
    shown = [*(REPO / "exercises").glob("*.ipynb"), *(REPO / "course").glob("[0-9][0-9]_*.ipynb")]
    statements = " ".join(c.source for p in shown for c in nbformat.read(p, as_version=4).cells
                          if c.get("metadata", {}).get("slideshow", {}).get("slide_type") != "notes")
    assert leaks(out, regions, allowed=statements) == {}
    # the control: a page holding one solution region, highlighted as the site highlights code, is caught
    where, text = next((k, v) for k, v in regions.items() if "solution" in k and words(v).count(" ") > 10
                       and words(v) not in words(statements))
    spans = "".join(f"<span>{html.escape(t)}</span>" for t in re.split(r"(\W)", text))
    (tmp_path / "page.html").write_text(f"<html><body><pre>{spans}</pre></body></html>")
    assert leaks(tmp_path, {where: text}, allowed=statements), f"a leaked region must be found: {where}"


def _only_in_lesson_12(out: Path) -> str:
    texts = {p.stem: page_text(p).lower() for p in (out / "lessons").glob("*.html")}
    others = set(re.findall(r"[a-z]{8,}", " ".join(t for s, t in texts.items() if not s.startswith("12_"))))
    return sorted(set(re.findall(r"[a-z]{8,}", texts["12_long_context_moe"])) - others)[0]


@pytest.mark.slow
@pytest.mark.after_course
def test_site_pages_load_offline_search_math_plots_and_nothing_cut(site) -> None:
    if find_chromium() is None:
        pytest.skip("Chromium is not installed: `apt-get install -y chromium` (.ci/run does)")
    out, lessons = site
    pages = sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.html") if p.parent.name in ("lessons", "exercises"))
    pages = ["index.html", *pages]
    word = _only_in_lesson_12(out)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    try:
        with Chromium(offline=True, width=1280, height=800) as page:
            wait_for(lambda: urllib.request.urlopen(base + "index.html", timeout=2).status == 200, 30, "the site's server")
            cut = {}
            for name in pages:
                page.goto(base + name)
                if found := page.evaluate(CUT % "false"):
                    cut[name] = found
            assert not cut, f"content cut at the right edge: {cut}"
            assert page.evaluate(CUT % "true"), "the measurement must see an unwrapped 400-character line"

            page.goto(base + "lessons/02_collectives.html")
            page.screenshot(SHOTS / "02_collectives.png")
            drawn = page.evaluate("[...document.querySelectorAll('div.cell_output img')]"
                                  ".filter(i => i.complete && i.naturalWidth > 50).length")
            if lessons["02_collectives"][1]:  # executed: its plots are on the page, drawn
                assert drawn >= 1, "lesson 02's plots are not drawn"
            wait_for(lambda: page.evaluate("document.querySelectorAll('mjx-container').length"), 30,
                     "MathJax (local) to typeset a formula on lesson 02")

            page.goto(f"{base}search.html?q={word}")
            hits = wait_for(lambda: page.evaluate("[...document.querySelectorAll('#search-results li a')]"
                                                  ".map(a => a.getAttribute('href'))"), 30, f"search results for {word!r}")
            page.screenshot(SHOTS / "search.png")
            assert any("12_long_context_moe" in h for h in hits), (word, hits)
            remote = [u for u in page.requests() if not u.startswith((base, "data:", "blob:", "about:"))]
            assert remote == [], f"the site asked the network for {remote}"
            assert page.failed_requests() == [], page.failed_requests()
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"\nsite: {len(pages)} pages, searched {word!r}: {hits[:3]}; executed lessons: "
          f"{json.dumps([s for s, (_, ran) in lessons.items() if ran])}")
