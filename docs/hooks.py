"""MkDocs hooks (mkdocs.yml `hooks:`): the site is docs/ plus the pages that live beside their code.

- README.md (the home page), analysis/README.md and conf/experiment/README.md join the site from where they are,
  so GitHub and the site show one text; nothing is copied, linked or generated on disk, and a fresh clone builds.
- Every relative link of every page is written as the site sees it: a link to one of those pages, or from them
  into docs/, to its page; a link to a file of the repository that the site does not hold (a module, a test, a
  yaml) to its path in code. A link to a file that does not exist stays a link, so `mkdocs build --strict` fails.
- docs/SCHEMES.md's table of every scheme is rendered from the registry (``scheme_table``), and a snippet to paste
  for each (``scheme_snippets``: its command line and its Python), so a new scheme joins both with no edit of a
  page; conf/experiment/README.md's table of presets from their yamls (``preset_table``).
- The Results page is the report of the newest default ablation, ``benchmarks/results/default/default_report.md``,
  with the figures and tables kept beside it; a link of that report to a file that was not kept becomes its text.
  Every other record under benchmarks/ stays out of the site (a link to it shows its repository path).
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
RESULTS = "benchmarks/results/default"  # the current results: replaced whole when the default ablation is rerun
RESULTS_PAGE = "RESULTS.md"
RESULT_FILES = (".png", ".csv")
# an inline link or image: [text](target) with an optional title
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(\s+\"[^\"]*\")?\)")
# read left to right: code (a fenced block, an inline span: a link there is text) or a link, whose text may hold code
TOKEN = re.compile(r"(?P<code>(?ms:^(```|~~~).*?^\2[ \t]*$)|(`+)[^`\n](?:.|\n(?!\n))*?\3)|" + LINK.pattern)


def _results() -> dict[str, str]:
    """Repository path -> site path of the Results page and of the figures and tables beside its report."""
    folder = ROOT / RESULTS
    out = {f"{RESULTS}/default_report.md": RESULTS_PAGE}
    for f in sorted(folder.rglob("*")):
        if f.suffix in RESULT_FILES:
            out[f.relative_to(ROOT).as_posix()] = "results/" + f.relative_to(folder).as_posix()
    return out


OUTSIDE.update(_results())


def on_files(files: Files, config) -> Files:
    for repo_path, site_path in OUTSIDE.items():
        source = ROOT / repo_path
        content = source.read_text() if source.suffix == ".md" else source.read_bytes()
        files.append(File.generated(config, site_path, content=content))
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
    elif page_repo.startswith(RESULTS + "/"):
        return "-"  # a file the record did not keep: its text
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
        if site == "-":
            return text
        if site == "":  # a module, a test, a yaml: its path, which the reader finds in the repository
            path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), target.partition("#")[0]))
            shown = text.strip("`")
            return f"`{path}`" if shown in (path, posixpath.basename(path), target) else f"{text} (`{path}`)"
        return f"{bang}[{text}]({site}{title or ''})"

    return TOKEN.sub(lambda m: m.group(0) if m.group("code") else link(LINK.fullmatch(m.group(0))), markdown)


SCHEME_TABLE = "<!-- the table of schemes: rendered here from the registry by docs/hooks.py -->"


def _first_sentence(text: str) -> str:
    return re.split(r"(?<! al)\. (?=[A-Z])", " ".join(text.split()))[0].rstrip(".")


def scheme_table() -> str:
    """The table of every scheme of conf/posenc/: a registered scheme's row from its class (``family``,
    ``positions_enter``, ``with_memory``; its kind and docstring where a scheme leaves them empty), a preset of
    another scheme's options from its yaml's opening comment."""
    import inspect

    import yaml

    from posenc_lab.positional import SCHEMES

    rows = ["| name | family | where positions enter | with memory | try it |", "|---|---|---|---|---|"]
    for path in sorted((ROOT / "conf" / "posenc").glob("*.yaml")):
        name, text = path.stem, path.read_text()
        if name in SCHEMES:
            cls = SCHEMES[name]
            where = cls.positions_enter or _first_sentence(inspect.getdoc(inspect.getmodule(cls)) or "")
            row = [cls.family or cls.kind, where, cls.with_memory or "-"]
        else:
            base = (yaml.safe_load(text).get("defaults") or ["?"])[0]
            comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
            row = [f"a preset of `{base}`", _first_sentence(comment), f"as `{base}`"]
        rows.append(f"| `{name}` | " + " | ".join(c.replace("|", "\\|") for c in row) + f" | `posenc={name}` |")
    return "\n".join(rows)


SCHEME_SNIPPETS = "<!-- a snippet for each scheme: rendered here from conf/posenc/ by docs/hooks.py -->"
SNIPPET_LENGTHS = {"segment_len": 64, "mem_len": 32}  # the run the Python snippets size their options to


def scheme_snippet(name: str, composer) -> tuple[str, str]:
    """Scheme ``name`` of conf/posenc/ ready to paste: the command line that trains it with memory, and the Python
    that builds it with every option of its yaml written out (those left null sized as a run of
    ``SNIPPET_LENGTHS`` sizes them; still null: the scheme's default, left out)."""
    from omegaconf import OmegaConf

    from posenc_lab.positional import sized_options

    options = OmegaConf.to_container(composer.compose([f"posenc={name}"]).posenc, resolve=True)
    scheme = options.pop("name")
    options = {k: v for k, v in sized_options(scheme, options, **SNIPPET_LENGTHS).items() if v is not None}
    segment, memory = SNIPPET_LENGTHS["segment_len"], SNIPPET_LENGTHS["mem_len"]
    command = f"posenc-lab train posenc={name} data.segment_len={segment} model.mem_len={memory}"
    kwargs = _python(options)
    if len(kwargs) > 60:  # one option a line
        kwargs = "{\n" + "".join(f"        {_python(k)}: {_python(v)},\n" for k, v in options.items()) + "    }"
    python = (
        "from posenc_lab.model import MemoryTransformer, ModelConfig\n\n"
        f"config = ModelConfig(\n    posenc={_python(scheme)},\n    posenc_kwargs={kwargs},\n    mem_len={memory},\n)\n"
        f"model = MemoryTransformer(config)  # forward(tokens): tokens [B, L], L <= {segment}"
    )
    return command, python


def _python(value) -> str:
    """A yaml value as a Python literal in the house's style (double quotes)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(k)}: {_python(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    return repr(value)


def scheme_snippets() -> str:
    """A command line and a Python snippet for every scheme of conf/posenc/ (``scheme_snippet``)."""
    from posenc_lab.compose import Composer

    parts = []
    with Composer() as composer:
        for path in sorted((ROOT / "conf" / "posenc").glob("*.yaml")):
            command, python = scheme_snippet(path.stem, composer)
            parts.append(f"**`{path.stem}`**\n\n```bash\n{command}\n```\n\n```python\n{python}\n```")
    return "\n\n".join(parts)


PRESET_TABLE = "<!-- the table of presets: rendered here from conf/experiment/ by docs/hooks.py -->"


def preset_table() -> str:
    """The table of every preset of conf/experiment/: its command (an ablation's or a training's) and the first
    sentence of its opening comment."""
    rows = ["| preset | command | what |", "|---|---|---|"]
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        text = path.read_text()
        comment = " ".join(line.lstrip("# ") for line in text.splitlines()[1:] if line.startswith("#"))
        command = "ablate" if re.search(r"^ablate:", text, re.M) else "train"
        what = _first_sentence(comment).replace("|", "\\|")
        rows.append(f"| `{path.stem}` | `posenc-lab {command} experiment={path.stem}` | {what} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if SCHEME_TABLE in markdown:
        markdown = markdown.replace(SCHEME_TABLE, scheme_table())
    if SCHEME_SNIPPETS in markdown:
        markdown = markdown.replace(SCHEME_SNIPPETS, scheme_snippets())
    if PRESET_TABLE in markdown:
        markdown = markdown.replace(PRESET_TABLE, preset_table())
    return rewrite(markdown, repo_path(page.file.src_uri))
