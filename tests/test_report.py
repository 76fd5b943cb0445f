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
    card = FeatureCard("feature 7", key_lists=[TokenList("key full", [" Paris", " <tag>"], [2.0, 1.0])],
                       value_lists=[TokenList("value full", [" France"], [1.5])],
                       module_shares={"direct": 0.6, "blocks.3.mlp": -0.4})
    return build_report(tmp_path / "r.html", [Section("S", text="t", figures=[fig], tables=[(["a"], [[1.5]])],
                                                      cards=[card])])


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
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1400",
                    "--virtual-time-budget=5000", f"--screenshot={shot}", f"file://{path}"],
                   check=True, capture_output=True, timeout=120)
    image = Image.open(shot).convert("RGB")
    red = sum(1 for r, g, b in image.getdata() if r > 200 and g < 60 and b < 60)
    assert red > 2000, f"only {red} red pixels: the plot did not render"


@dataclass
class _Sig:
    feature_ids: torch.Tensor
    hook: str
    method: str
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    bottom_ids: torch.Tensor
    bottom_scores: torch.Tensor
    top_strings: list | None = None
    bottom_strings: list | None = None
    module_names: list | None = None
    module_shares: torch.Tensor | None = None


def test_neuronpedia_export(tmp_path):
    value = _Sig(torch.tensor([4, 9]), "blocks.2.hook_resid_post", "full", torch.tensor([[1, 2], [3, 4]]),
                 torch.tensor([[2.0, 1.0], [5.0, 4.0]]), torch.tensor([[7, 8], [5, 6]]),
                 torch.tensor([[-2.0, -1.0], [-3.0, -1.0]]), module_names=["direct", "blocks.3.mlp"],
                 module_shares=torch.tensor([[0.7, 0.3], [0.2, 0.8]]))
    key = _Sig(torch.tensor([4, 9]), "blocks.2.ln2.hook_normalized", "full", torch.tensor([[0, 1], [2, 3]]),
               torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2))
    records = neuronpedia_features(value, key=key, model_id="m", sae_id="ffkv",
                                   activations={9: [{"tokens": ["a", "b"], "values": [0.5, 2.0]}]})
    path = export_neuronpedia(tmp_path / "np.json", records)
    back = json.loads(path.read_text())
    assert back[1]["layer"] == "2-ffkv" and back[1]["index"] == "9"
    assert back[1]["pos_str"] == ["3", "4"] and back[1]["neg_values"] == [-3.0, -1.0]
    assert back[1]["activations"][0]["maxValue"] == 2.0
    assert back[0]["query_lens"]["module_shares"] == {"direct": pytest.approx(0.7), "blocks.3.mlp": pytest.approx(0.3)}
    key.feature_ids = torch.tensor([9, 4])
    with pytest.raises(ValueError, match="same features"):
        neuronpedia_features(value, key=key, model_id="m", sae_id="ffkv")
