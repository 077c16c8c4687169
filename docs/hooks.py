"""MkDocs hooks (mkdocs.yml `hooks:`): the site is docs/ plus the pages that live beside their code.

- README.md (the home page), analysis/README.md and conf/experiment/README.md join the site from where they are,
  so GitHub and the site show one text; nothing is copied, linked or generated on disk, and a fresh clone builds.
- Every relative link of every page is written as the site sees it: a link to one of those pages, or from them
  into docs/, to its page; a link to a file of the repository that the site does not hold (a module, a test, a
  yaml) to its path in code. A link to a file that does not exist stays a link, so `mkdocs build --strict` fails.
- Under docs/perf/ only README.md and LOG.md are pages; every other file there is a raw output kept as it was
  written (a report whose figures were not kept, a benchmark's table) and is served as a file, not rendered.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# repository path -> site path of the pages outside docs/
OUTSIDE = {
    "README.md": "index.md",
    "analysis/README.md": "analysis/README.md",
    "conf/experiment/README.md": "conf/experiment/README.md",
}
PERF_PAGES = ("README.md", "LOG.md")
# an inline link or image: [text](target) with an optional title
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(\s+\"[^\"]*\")?\)")
# read left to right: code (a fenced block, an inline span: a link there is text) or a link, whose text may hold code
TOKEN = re.compile(r"(?P<code>(?ms:^(```|~~~).*?^\2[ \t]*$)|(`+)[^`\n](?:.|\n(?!\n))*?\3)|" + LINK.pattern)


class _Raw(File):
    """A file served as written (not rendered), though its name ends in .md."""

    def is_documentation_page(self) -> bool:
        return False


def on_files(files: Files, config) -> Files:
    for f in list(files):
        parts = f.src_uri.split("/")
        if parts[0] == "perf" and f.src_uri.endswith(".md") and parts[-1] not in PERF_PAGES:
            files.remove(f)
            files.append(_Raw(f.src_uri, f.src_dir, f.dest_dir, f.use_directory_urls))
    for repo_path, site_path in OUTSIDE.items():
        files.append(File.generated(config, site_path, content=(ROOT / repo_path).read_text()))
    return files


def repo_path(site_path: str) -> str:
    """Where the page at ``site_path`` lives in the repository."""
    return next((r for r, s in OUTSIDE.items() if s == site_path), f"docs/{site_path}")


def site_target(page_repo: str, target: str) -> str | None:
    """The link ``target`` of the page at ``page_repo`` as the site sees it (relative to the page's site path);
    "" for an existing repository file the site does not hold; None to leave the link as it is."""
    path, _, anchor = target.partition("#")
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
        return None  # a URL, a mail address, an anchor of the page itself
    repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if repo_target in OUTSIDE:
        site = OUTSIDE[repo_target]
    elif repo_target.startswith("docs/"):
        site = repo_target[len("docs/") :]
    elif (ROOT / repo_target).exists() and not repo_target.startswith(".."):
        return ""
    else:
        return None  # not there, or outside the repository: left as written, for mkdocs to name
    here = posixpath.dirname(OUTSIDE.get(page_repo, page_repo[len("docs/") :]))
    return posixpath.relpath(site, here or ".") + (f"#{anchor}" if anchor else "")


def rewrite(markdown: str, page_repo: str) -> str:
    """``markdown`` (the page at ``page_repo`` in the repository) with its relative links as the site sees them."""

    def link(m: re.Match) -> str:
        bang, text, target, title = m.groups()
        site = site_target(page_repo, target)
        if site is None:
            return m.group(0)
        if site == "":  # a module, a test, a yaml: its path, which the reader finds in the repository
            path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), target.partition("#")[0]))
            shown = text.strip("`")
            return f"`{path}`" if shown in (path, posixpath.basename(path), target) else f"{text} (`{path}`)"
        return f"{bang}[{text}]({site}{title or ''})"

    return TOKEN.sub(lambda m: m.group(0) if m.group("code") else link(LINK.fullmatch(m.group(0))), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return rewrite(markdown, repo_path(page.file.src_uri))
