"""The documentation site builds in strict mode, its generated pages say what the code says, and the README is a
landing page whose worked example runs.

* ``mkdocs build --strict`` (``make docs``) succeeds with no warning: a broken link, a missing page or anchor, an
  API reference (``::: geosharp_ref.…``) that does not resolve, a docstring griffe cannot parse, or a results
  marker naming a missing file fails the build, and so this test. A planted broken link and a planted unknown
  API object are refused (the strictness is real, not assumed).
* The command-line reference lists every command, ``population`` action and option of
  ``geosharp_ref.cli.parser.build_parser()`` (walked here independently of the hook that renders it).
* The study tables are the committed CSV files' numbers (read here with :mod:`csv`, formatted independently).
* The README is at most 300 lines, links only to files that exist, and its worked example runs: moving the model
  along its GL(h) orbits leaves geodesic sharpness unchanged (to the 6 printed decimals) while adaptive
  sharpness changes (rel > 1e-3), with the values the README prints (rel 1e-2).
"""
from __future__ import annotations

import argparse
import csv
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module exactly as ``make docs`` builds it (strict), into a temp dir."""
    out = tmp_path_factory.mktemp("site")
    proc = _build(ROOT / "mkdocs.yml", out)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert not re.search(r"^(WARNING|ERROR)\b", log, re.M), log[-4000:]
    return out


def _text(page: Path) -> str:
    """The visible text of a built page's article."""
    s = page.read_text(encoding="utf-8")
    s = s[s.find("<article"):s.find("</article>")]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", s)))


def test_site_builds_in_strict_mode_with_every_nav_page(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    listed = list(pages(config["nav"]))
    assert len(listed) > 20
    for md in listed:
        assert (ROOT / "docs" / md).is_file(), md
        src = Path(md)  # use_directory_urls is off: page.md -> page.html, README.md -> index.html
        built = src.with_name("index.html") if src.stem == "README" else src.with_suffix(".html")
        assert (site / built).is_file(), md
    for page in site.rglob("*.html"):  # every marker a hook owns was replaced
        assert not re.search(r"<!--\s*(geosharp-cli-reference|package-layout|[a-z]+-table|value|tau|range)\s",
                             page.read_text(encoding="utf-8")), page


@pytest.mark.parametrize("planted,needle", [
    ("[a page that is not there](no-such-page.md)", "no-such-page.md"),
    ("::: geosharp_ref.no_such_module", "geosharp_ref.no_such_module"),
    ("<!-- tau-table docs/no_such_results.csv -->", "no_such_results.csv"),
], ids=["broken-link", "unknown-api-object", "missing-results-file"])
def test_strict_build_refuses_a_broken_reference(tmp_path, planted, needle):
    """The same configuration on a two-page site with one planted broken reference: the build fails, naming it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# ok\n\n[the other page](other.md)\n", encoding="utf-8")
    (docs / "other.md").write_text(f"# planted\n\n{planted}\n", encoding="utf-8")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir=str(docs), nav=["index.md", "other.md"], exclude_docs="",
                  hooks=[str(ROOT / h) for h in config["hooks"]])
    config["markdown_extensions"] = [e for e in config["markdown_extensions"]
                                     if not (isinstance(e, dict) and "pymdownx.snippets" in e)]
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert needle in proc.stdout + proc.stderr


def _walk(parser: argparse.ArgumentParser, prefix: str):
    """(command path, parser) for the parser and every sub-command, depth first."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{prefix} {name}")


def test_cli_reference_lists_every_command_and_option(site):
    from geosharp_ref.cli.parser import build_parser

    text = _text(site / "reference" / "cli.html")
    commands = list(_walk(build_parser(), "geosharp"))
    assert len(commands) > 10
    for path, parser in commands:
        if path != "geosharp":
            assert f" {path} ¶" in text, path  # a heading per command and population action
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in text, (path, option)


def _signed(x: float) -> str:
    s = f"{x:+.2f}"
    return "+0.00" if s == "-0.00" else s.replace("-", "−")


@pytest.mark.parametrize("csv_file,page", [
    ("docs/population_vision_tau.csv", "studies/populations"),
    ("docs/population_text_ablations_tau.csv", "studies/populations"),
    ("docs/minilm/seeds/correlation_tau.csv", "studies/minilm"),
    ("docs/minilm/recipes/correlation-ablations_tau.csv", "studies/minilm"),
])
def test_study_tables_show_the_committed_results(site, csv_file, page):
    text = _text(site / f"{page}.html")
    with open(ROOT / csv_file, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for r in rows:
        cell = f"{_signed(float(r['tau']))} [{_signed(float(r['ci_low']))}, {_signed(float(r['ci_high']))}]"
        assert cell in text, (csv_file, r["measure"], cell)


def test_contrast_table_lists_sizes_in_order_and_the_primary_familys_verdicts(tmp_path, monkeypatch):
    """The contrast table of a reanalysis.json lists the target sizes in increasing order (JSON keeps them as
    strings: "size=0.0002" sorts before "size=2e-05"); for the tweets protocol's analysis.json it adds the
    bootstrap and Holm-adjusted p and the verdict of each contrast of the primary family."""
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import results_tables
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    import json

    def cell(d, p, better):
        return dict(difference=d, ci=[d - 0.1, d + 0.1], given_train_error=dict(difference=d / 2, ci=[-0.1, 0.2]),
                    paper_attenuated_difference=0.21, p_bootstrap=p, p_holm=min(1.0, 2 * p), geodesic_better=better)

    data = dict(models=80, bootstrap=1000, signed_contrast={
        "size=0.0002": {"geodesic-inv - adaptive": cell(0.3, 0.004, True)},
        "size=2e-05": {"geodesic-inv - adaptive": cell(0.05, 0.4, False),
                       "geodesic-inv-linearised - adaptive-linearised": cell(0.9, 0.5, False)}})
    (tmp_path / "analysis.json").write_text(json.dumps(data, sort_keys=True))
    monkeypatch.setattr(results_tables, "ROOT", tmp_path)
    rows = [r for r in results_tables.contrast_table("analysis.json").splitlines() if r.startswith("| ‖")]
    assert rows == ["| ‖Δθ‖/‖θ‖ = 2e-5 | geodesic-inv - adaptive | +0.05 [−0.05, +0.15] | +0.03 [−0.10, +0.20] | "
                    "+0.21 | – | 0.400 | 0.800 | no |",
                    "| ‖Δθ‖/‖θ‖ = 2e-4 | geodesic-inv - adaptive | +0.30 [+0.20, +0.40] | +0.15 [−0.10, +0.20] | "
                    "+0.21 | – | 0.004 | 0.008 | yes |"]


README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_a_landing_page():
    assert len(README.splitlines()) <= 300
    assert "make demo" in README and "make test" in README
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) > 10
    for link in local:
        assert (ROOT / link).exists(), link
    assert not re.search(r"\b\d{3,4} (tests|passed)\b", README)  # no hard-coded test count to go stale


def _worked_example() -> tuple[str, str]:
    """The README's worked example (the python block after its marker) and the output block that follows it."""
    m = re.search(r"<!-- worked-example[^>]*-->\s*```python\n(.*?)```\s*```\n(.*?)```", README, re.S)
    assert m, "README: no worked example after the '<!-- worked-example' marker"
    return m.group(1), m.group(2)


def test_readme_worked_example_runs_and_shows_the_invariance(tmp_path):
    code, shown = _worked_example()
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**ENV, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pattern = r"^(original|moved)\s+adaptive ([\d.]+)\s+geodesic-mix ([\d.]+)$"
    got = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(pattern, proc.stdout, re.M)}
    printed = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(pattern, shown, re.M)}
    assert set(got) == set(printed) == {"original", "moved"}, proc.stdout
    (ada0, geo0), (ada1, geo1) = got["original"], got["moved"]
    assert abs(geo1 - geo0) <= 1e-6 * abs(geo0) + 1e-6  # printed to 6 decimals: unchanged along the orbit
    assert abs(ada1 - ada0) > 1e-3 * abs(ada0)           # adaptive sharpness sees the symmetry
    for key in got:  # the README shows what the example prints (Auto-PGD, float64, fixed seeds)
        assert got[key] == pytest.approx(printed[key], rel=1e-2), (key, got[key], printed[key])
    assert proc.stdout.splitlines()[0] == shown.splitlines()[0]  # the symmetry map's summary line
