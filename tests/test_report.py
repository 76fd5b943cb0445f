import json
import shutil
import subprocess
from dataclasses import dataclass

import plotly.graph_objects as go
import pytest
import torch

from tl_query_lens.report.html import FeatureCard, Section, TokenList, build_report
from tl_query_lens.report.neuronpedia import export_neuronpedia, neuronpedia_features


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


def test_neuronpedia_export_of_query_lens_signatures(tmp_path):
    from tests.helpers import tiny_model, tiny_tokens
    from tl_query_lens import FFKV, QueryLens

    model = tiny_model("gelu_ln")
    lens = QueryLens(model, tiny_tokens(model), progress=False)
    sae = FFKV.from_model(model, 1)
    value = lens.value_signatures(sae, [4, 9], k=3, method="first_order")
    key = lens.key_signatures(sae, [4, 9], k=3)
    records = neuronpedia_features(
        value, key=key, model_id="m", sae_id="ffkv", activations={9: [{"tokens": ["a", "b"], "values": [0.5, 2.0]}]}
    )
    path = export_neuronpedia(tmp_path / "np.json", records)
    back = json.loads(path.read_text())
    assert back[1]["layer"] == "1-ffkv" and back[1]["index"] == "9"
    assert back[1]["pos_str"] == [str(t) for t in value.top_ids[1].tolist()]  # no tokenizer: ids as strings
    assert back[1]["neg_values"] == pytest.approx(value.bottom_scores[1].tolist())
    assert back[1]["activations"][0]["maxValue"] == 2.0
    shares = back[0]["query_lens"]["module_shares"]
    assert list(shares) == value.module_names
    assert list(shares.values()) == pytest.approx(value.module_shares[0].tolist())
    assert back[0]["query_lens"]["key_top_values"] == pytest.approx(key.top_scores[0].tolist())
    with pytest.raises(ValueError, match="same features"):
        neuronpedia_features(value, key=lens.key_signatures(sae, [9, 4], k=3), model_id="m", sae_id="ffkv")
    with pytest.raises(ValueError, match="value="):
        neuronpedia_features(key, key=value, model_id="m", sae_id="ffkv")

    @dataclass
    class StandIn:  # duck-typed look-alike: refused, so the export cannot drift from the real result class
        feature_ids: torch.Tensor
        hook: str

    with pytest.raises(TypeError, match="Signatures"):
        neuronpedia_features(StandIn(value.feature_ids, value.hook), model_id="m", sae_id="ffkv")
