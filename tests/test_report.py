import shutil
import subprocess

import plotly.graph_objects as go
import pytest

from tl_query_lens.report.html import FeatureCard, Section, TokenList, build_report


def _report(tmp_path):
    fig = go.Figure(go.Bar(x=["a", "b", "c"], y=[3, 1, 2], marker_color="#ff0000"))
    card = FeatureCard(
        "feature 7",
        key_lists=[TokenList("key full", [" Paris", " <tag>"], [2.0, 1.0])],
        value_lists=[TokenList("value full", [" France"], [1.5])],
        module_shares={"direct": 0.6, "blocks.3.mlp": -0.4},
    )
    return build_report(
        tmp_path / "r.html", [Section("S", text="t", figures=[fig], tables=[(["a"], [[1.5]])], cards=[card])]
    )


def test_report_is_self_contained(tmp_path):
    path = _report(tmp_path)
    text = path.read_text()
    assert text.count("Plotly.newPlot") == 1 and "<script src=" not in text  # plotly.js inlined, no network
    assert "&lt;tag&gt;" in text and "blocks.3.mlp" in text  # token strings escaped


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="needs chromium")
def test_plots_render_in_headless_chromium(tmp_path):
    """The screenshot must contain the bar chart's red pixels: a blank canvas would have none."""
    from PIL import Image

    path = _report(tmp_path)
    shot = tmp_path / "shot.png"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,1400",
            "--virtual-time-budget=5000",
            f"--screenshot={shot}",
            f"file://{path}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    image = Image.open(shot).convert("RGB")
    red = sum(1 for r, g, b in image.getdata() if r > 200 and g < 60 and b < 60)
    assert red > 2000, f"only {red} red pixels: the plot did not render"


_UNSAFE_LINKS = [
    "javascript:alert(1)",
    "JavaScript:alert(1)",
    " javascript:alert(1)",
    "java\tscript:alert(1)",
    "\x01javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "file:///etc/passwd",
]
_SAFE_LINKS = ["atlas/index.html#f/3-ffkv/7", "../other.html", "#top", "https://example.org/f?x=1", "http://a.b/c"]


def test_card_links_only_relative_or_http(tmp_path, caplog):
    """A card's link reaches an ``href`` only as a relative path or an http(s) URL; a script or data URL is shown
    unlinked with a warning. The hrefs are read back with the standard library's HTML parser."""
    from html.parser import HTMLParser

    cards = [FeatureCard(f"card {i}", link=link) for i, link in enumerate(_UNSAFE_LINKS + _SAFE_LINKS)]
    with caplog.at_level("WARNING"):
        path = build_report(tmp_path / "r.html", [Section("S", cards=cards)])
    hrefs: list[str] = []

    class Links(HTMLParser):
        def handle_starttag(self, tag, attrs):
            hrefs.extend(value for name, value in attrs if tag == "a" and name == "href")

    Links().feed(path.read_text())
    assert hrefs == _SAFE_LINKS
    assert sum("shown unlinked" in r.getMessage() for r in caplog.records) == len(_UNSAFE_LINKS)
    assert all(f"card {i}" in path.read_text() for i in range(len(cards)))  # the titles stay
