"""The 2,000-ablation figures of analysis/README.md: any false verdict at the global null and the coverage of the
xl:mem32 - shaw:mem32 interval, at the components in analysis/variance_components.json, on the default split and
a designed one. Run from the repository root: python docs/perf/2026-12-03_default/error_rates_2000.py"""

from posenc_lab.tables import markdown_table
from posenc_lab_analysis.coverage import MEASURED, SPLIT, coverage, designed, error_rates

for layout in (SPLIT, designed()):
    df = error_rates(layout, MEASURED, 2000, seed=5)
    print(f"\n{layout.name}, global null, 2000 ablations; any false claim: {df.attrs['any_false']:.4f}")
    print(markdown_table(df, default=4))
    print(f"coverage of the 95% interval, 2000 simulations: {coverage(layout, MEASURED, 2000, seed=5)}")
