"""A report section is one module and its keys in conf/ablate.yaml (the recipe of analysis/README.md, "Add a report
section", followed step by step): a throwaway section, written to a temporary module, with its block and its
place added to a copy of conf/ablate.yaml, is found by the report, reads the shared per-token dumps, takes its
setting from an override, and writes its table's CSV and its figure's PNG, both linked in report.md, where the
order says."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from posenc_lab import config_dir
from posenc_lab.compose import compose
from posenc_lab_analysis.dumps import read_dump
from posenc_lab_analysis.report import ReportSettings, build_report
from posenc_lab_analysis.runs import find_runs
from posenc_lab_analysis.sections import SECTIONS
from tests.analysis.test_report import assert_cell_equals, md_tables

NAME = "throwaway_parts"
SOURCE = f'''
"""Each cell's as-trained loss over the first, second, ... of `parts` equal shares of the scored tokens."""

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posenc_lab_analysis.dumps import stack
from posenc_lab_analysis.sections import CORPUS, Figure, Part, Section, Table, register


@register
class ThrowawayParts(Section):
    name = "{NAME}"
    title = "Loss by share of the text"
    scope = CORPUS

    @dataclass
    class Settings:
        parts: int  # equal shares of the scored tokens

    def measure(self, ctx):
        g = ctx.group  # the shared measurements: cells, per-token dumps, evidence
        rows = []
        for cell, runs in g.cells.items():
            loss = stack([g.trained[r.name] for r in runs]).mean(0) * g.scale
            for k, share in enumerate(np.array_split(loss, ctx.settings.parts)):
                rows.append({{"cell": cell, "share": k, g.figure: float(share.mean())}})
        return pd.DataFrame(rows)

    def render(self, ctx, df):
        fig, ax = plt.subplots(figsize=(6, 4))
        for cell, d in df.groupby("cell", sort=False):
            ax.plot(d["share"], d[ctx.group.figure], marker="o", label=cell)
        ax.set(xlabel="share of the scored tokens", ylabel=ctx.group.figure)
        ax.legend(fontsize=6)
        path = ctx.file("{NAME}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        text = f"The as-trained loss of each cell over {{ctx.settings.parts}} equal shares of the scored tokens."
        return Part(text, [Table("table_{NAME}", df, "loss by share")], [Figure(path, "loss by share of the text")])
'''


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    """Step 1: the module, imported (so registered). Step 2: its block and its place (after the ablation table) in
    conf/ablate.yaml, here of a copy of conf/."""
    root = tmp_path_factory.mktemp("new_section")
    module = root / f"{NAME}.py"
    module.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location(f"_test_section_{NAME}", module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    conf = shutil.copytree(config_dir(), root / "conf")
    ablate = yaml.safe_load((conf / "ablate.yaml").read_text())
    analysis = ablate["ablate"]["analysis"]
    analysis["sections"].insert(analysis["sections"].index("table6") + 1, NAME)
    analysis[NAME] = {"parts": 4}
    (conf / "ablate.yaml").write_text(yaml.safe_dump(ablate, sort_keys=False))
    yield conf
    SECTIONS.pop(NAME, None)
    sys.modules.pop(spec.name, None)


def settings(conf, *overrides: str) -> ReportSettings:
    cfg = compose("ablate", ["experiment=tiny", *overrides], conf_dir=conf)
    return ReportSettings.read(OmegaConf.to_container(cfg.ablate.analysis, resolve=True))


def test_the_report_finds_it_and_writes_its_table_and_figure(section, tiny_ablation, tmp_path):
    assert settings(section).blocks[NAME].parts == 4  # conf/ablate.yaml's value
    s = settings(section, f"ablate.analysis.{NAME}.parts=3")  # an override of it
    out = tmp_path / "report"
    shutil.copytree(tiny_ablation / "report" / "dumps", out / "dumps")  # the same runs: their dumps are reused
    runs = find_runs([tiny_ablation / "runs"])
    text = build_report(runs, out, s, without={"speed"}, log=lambda _: None).read_text()
    titles = re.findall(r"^## \d+\. (.+)$", text, re.M)
    assert titles[titles.index(SECTIONS["table6"].title) + 1] == "Loss by share of the text"
    df = pd.read_csv(out / f"table_{NAME}.csv")
    t6 = pd.read_csv(out / "table_ablation.csv")
    assert list(df["cell"].unique()) == list(t6["cell"]) and (df.groupby("cell")["share"].count() == 3).all()
    md = md_tables(text)[f"table_{NAME}"]  # linked in report.md, the same numbers as its CSV
    for i in range(len(md)):
        for col in md.columns:
            assert_cell_equals(md.at[i, col], df.at[i, col], f"{NAME}[{i}].{col}")
    n = int(read_dump(out / "dumps" / "as_trained" / f"{runs[0].name}.npz").scored.sum())
    sizes = [len(x) for x in np.array_split(np.arange(n), 3)]
    for cell, d in df.groupby("cell"):  # the shares' mean is the cell's test figure of the ablation table
        figure = t6.loc[t6["cell"] == cell, "test_bpb"].item()
        assert np.average(d["bpb"], weights=sizes) == pytest.approx(figure, rel=1e-5)
    assert f"]({NAME}.png)" in text and (out / f"{NAME}.png").stat().st_size > 5000


def test_a_bad_setting_of_it_is_one_line_naming_the_key(section):
    with pytest.raises(ValueError, match=rf"^ablate\.analysis\.{NAME}\.parts: Value 'many' .*Integer$"):
        settings(section, f"ablate.analysis.{NAME}.parts=many")
    with pytest.raises(ValueError, match=rf"^ablate\.analysis\.{NAME}\.bins is not a key of .*; the keys are: parts$"):
        settings(section, f"+ablate.analysis.{NAME}.bins=2")
