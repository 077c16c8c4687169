"""The documentation site as a reader sees it: built strictly (as .ci/run does), served on loopback and opened in a
real headless Chromium, which measures what a reader would notice: a command clipped in its code block, a numbered
list run together into a paragraph, a figure that does not load, the report shown as raw markdown.

Slow (a site build and a browser): `pytest -m slow tests/test_site.py`. Needs the docs extra
(`pip install -e '.[docs]'`) and Chromium (`apt-get install chromium`); without them it is skipped, saying which."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

# Loads each page in a frame of the same origin and writes what it measured into #out, for --dump-dom to read.
HARNESS = """<!doctype html><meta charset="utf-8"><pre id="out">pending</pre>
<iframe id="f" style="width:1000px;height:800px"></iframe>
<script>
const pages = PAGES, found = {};
function next(i) {
  if (i === pages.length) { document.getElementById('out').textContent = JSON.stringify(found); return; }
  const f = document.getElementById('f');
  f.onload = () => setTimeout(() => {
    const d = f.contentDocument;
    found[pages[i]] = {
      clipped: [...d.querySelectorAll('pre > code')].filter(c => c.scrollWidth > c.clientWidth + 1)
        .map(c => c.textContent.slice(0, 60)),
      ordered_items: d.querySelectorAll('article ol > li').length,
      images: [...d.querySelectorAll('article img')].map(m => [m.getAttribute('src'), m.naturalWidth]),
      raw_markdown: /^#{1,3} |\\]\\(/m.test(d.querySelector('article') ? d.querySelector('article').innerText : ''),
      text: d.querySelector('article') ? d.querySelector('article').innerText.slice(0, 20000) : '',
    };
    next(i + 1);
  }, 300);
  f.src = pages[i];
}
next(0);
</script>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(["mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env, check=True)
    return out


def _seen(site: Path, pages: list[str]) -> dict[str, dict]:
    """What Chromium shows of each page (site paths): clipped code lines, list items, images, raw markdown."""
    (site / "harness.html").write_text(HARNESS.replace("PAGES", json.dumps(pages)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=30000",
             "--window-size=1280,1000", "--dump-dom", f"http://127.0.0.1:{server.server_port}/harness.html"],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
    finally:
        server.shutdown()
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S).group(1)
    assert found != "pending", "the harness did not finish: a page did not load"
    return json.loads(found.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))


@pytest.mark.slow
def test_the_site_reads_as_written_in_a_real_browser(site):
    seen = _seen(site, ["index.html", "EXTENDING/", "RESULTS/", "USAGE/"])
    home, extending, results = seen["index.html"], seen["EXTENDING/"], seen["RESULTS/"]
    # the two quick-start commands wrap instead of clipping, and are read whole
    assert not home["clipped"], f"code clipped on the landing page: {home['clipped']}"
    assert home["text"].count("pip install -e '.[dev]' && ") == 2
    # the recipes' numbered lists are lists, not run-on paragraphs
    assert extending["ordered_items"] >= 6
    # the figures load, on the landing page and the Results page, and the report is a page, not markdown
    for page in (home, results):
        assert page["images"] and all(width > 0 for _, width in page["images"]), page["images"]
    assert not results["raw_markdown"] and "verdict" in results["text"].lower()
