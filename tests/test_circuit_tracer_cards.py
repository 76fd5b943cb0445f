"""circuit-tracer feature cards: the layout and semantics of the frontend that the PyPI package ``circuit-tracer``
ships, checked against the activations of a direct pass and then in that frontend in real Chromium.

The browser test serves, from 127.0.0.1, the package's own ``frontend/assets`` (found with ``find_spec``, never
copied), the atlas's cards, and the libraries the frontend takes from a CDN (d3 v7, d3-jetpack, pako), which
``scripts/setup.sh`` fetches from npm into ``<venv>/share/tlql-js`` (``$TLQL_JS_DIR`` overrides). d3-jetpack 2.3.0's
UMD build replaces the global ``d3`` with an empty object when loaded by a script tag, so the page loads it through a
one-line AMD ``define`` that hands it the loaded d3. It is skipped where Chromium, chromedriver, selenium, the
package or those libraries are missing.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import tiny_export_atlas
from tl_query_lens import FFKV
from tl_query_lens.atlas.cards import HIST_BINS, cantor, feature_card, uncantor
from tl_query_lens.atlas.collect import HIST_PER_DECADE

SEQ = 16
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
_SPEC = importlib.util.find_spec("circuit_tracer")
FRONTEND = Path(_SPEC.submodule_search_locations[0]) / "frontend" / "assets" if _SPEC else None
JS = Path(os.environ.get("TLQL_JS_DIR") or Path(sys.prefix) / "share" / "tlql-js")
LIBS = ("d3.js", "d3-jetpack.js", "pako.min.js")


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    model, cfg, tokens, _ = tiny_export_atlas(tmp_path_factory.mktemp("ct-atlas"), ("ffkv:1", "ffkv:2"), SEQ)
    return model, cfg, tokens


def _card(out: Path, layer: int, index: int) -> dict:
    return json.loads((out / "exports" / "circuit-tracer" / "ffkv" / f"{cantor(layer, index)}.json").read_text())


def test_cantor_names_and_the_frontends_unpairing():
    # util.cantorUnpair of the frontend: w = floor((sqrt(8z + 1) - 1) / 2), t = (w² + w) / 2, y = z - t, x = w - y
    for layer in range(30):
        for index in (0, 1, 7, 255, 16383):
            z = cantor(layer, index)
            w = math.floor((math.sqrt(8 * z + 1) - 1) / 2)
            y = z - (w * w + w) // 2
            assert (w - y, y) == (layer, index) == uncantor(z)


def _card_model():
    """circuit-tracer's own pydantic model of a card (``frontend/feature_models.py``, loaded alone: the package's
    ``__init__`` needs its full dependencies), or None where the package is not installed."""
    if FRONTEND is None:
        return None
    spec = importlib.util.spec_from_file_location("ct_feature_models", FRONTEND.parent / "feature_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Model


def test_a_feature_that_never_fired_and_a_signed_one_get_finite_one_sided_domains():
    silent = {"i": 3, "scale": None, "max": 0.0, "min": 0.0, "density": 0.0, "top": [], "bands": []}
    silent["hist"] = {"edges": [], "counts": []}
    card = feature_card("4-ffkv", silent, [], lambda ctx, scale: [])
    json.dumps(card, allow_nan=False)
    assert (card["act_min"], card["act_max"]) == (0.0, 1.0)
    assert card["quantile_values"] == [0.0] * 100 and card["histogram"] == [0.0] * HIST_BINS
    signed = {**silent, "max": 2.0, "min": -3.0, "scale": 3.0, "hist": {"edges": [1.0, 1.78, 3.16], "counts": [4, 0]}}
    card = feature_card("4-ffkv", signed, [], lambda ctx, scale: [])
    assert (card["act_min"], card["act_max"]) == (0.0, 2.0) and card["quantile_values"][-1] == 2.0
    # 4 activations in [1, 1.78): evenly spread, so bins 25..44 of [0, 2] (width 0.04) share them
    assert sum(card["histogram"][:25]) == 0 and sum(card["histogram"][25:45]) == pytest.approx(4, abs=0.03)


def test_cards_hold_the_direct_pass_in_the_frontends_semantics(atlas):
    model, cfg, tokens = atlas
    out = Path(cfg.out)
    card_model = _card_model()
    names = sorted(p.name for p in (out / "exports" / "circuit-tracer" / "ffkv").glob("*.json"))
    assert len(names) == 128 and sorted(uncantor(int(n[:-5])) for n in names) == [
        (layer, i) for layer in (1, 2) for i in range(64)
    ]
    ratio = 10 ** (1 / HIST_PER_DECADE)  # one log bin of the atlas's histogram
    for layer in (1, 2):
        sae = FFKV.from_model(model, layer)
        _, cache = model.run_with_cache(tokens, names_filter=[sae.cfg.metadata.hook_name])
        acts = sae.encode(cache[sae.cfg.metadata.hook_name]).detach()[:, cfg.exclude_first_positions :]
        acts = acts.reshape(-1, acts.shape[-1])
        for i in range(64):
            card = _card(out, layer, i)
            assert card["index"] == i and card["transcoder_id"] == f"{layer}-ffkv"
            if card_model is not None:
                card_model.model_validate_json(json.dumps(card), strict=True)
            positive = acts[:, i][acts[:, i] > 0].double()
            q = card["quantile_values"]
            assert len(q) == 100 and q == sorted(q) and all(math.isfinite(v) for v in q)
            assert len(card["histogram"]) == HIST_BINS and card["act_min"] == 0.0
            if not len(positive):
                assert card["act_max"] == 1.0 and not any(card["histogram"]) and not any(q)
                continue
            assert card["act_max"] == pytest.approx(float(positive.max()), rel=1e-3) == q[-1]
            assert sum(card["histogram"]) == pytest.approx(len(positive), abs=HIST_BINS * 5e-4)  # bins to 3 decimals
            ranked = positive.sort().values.tolist()
            for p in range(1, 101):  # the p-th percentile lies in the log bin of the ceil(p n / 100)-th value
                x = ranked[math.ceil(p * len(ranked) / 100 - 1e-9) - 1]
                low = x / ratio**1.01 if x > 1e-3 * ratio else 0.0
                assert low <= q[p - 1] <= max(x, 1e-3) * ratio**1.01, (layer, i, p, q[p - 1], x)
            # equal-width bins over [0, act_max]: the count above act_max / 2 is that of the direct pass
            top_half = float((positive > card["act_max"] / 2).sum())
            assert abs(sum(card["histogram"][HIST_BINS // 2 :]) - top_half) <= 0.5 * len(positive) / 4 + 1


# ---- the frontend the package ships, in real Chromium ----

HARNESS = """<!DOCTYPE html><meta charset='utf-8'><link rel='icon' href='data:,'>
<link rel='stylesheet' href='./ct/style.css'><link rel='stylesheet' href='./ct/feature_examples/feature-examples.css'>
<div class='node-title'><span></span></div><div class='features-container'></div>
<script src='./lib/d3.js'></script>
<script>window.define = (deps, factory) => factory(...deps.map(() => window.d3)); window.define.amd = true</script>
<script src='./lib/d3-jetpack.js'></script><script>delete window.define</script>
<script src='./lib/pako.min.js'></script>
<script src='./ct/feature_examples/init-feature-examples-list.js'></script>
<script src='./ct/feature_examples/init-feature-examples-logits.js'></script>
<script src='./ct/feature_examples/init-feature-examples.js'></script>
<script src='./ct/util.js'></script>
<script src='./ct/attribution_graph/render-act-histogram.js'></script>
<script>
window.isLocalServing = true
window.fe = initFeatureExamples({containerSel: d3.select('.features-container'), showLogits: true, showExamples: true})
</script>"""
SHOW = """const [scan, z, activation, done] = arguments;
(async () => {
  while (!window.fe) await new Promise(r => setTimeout(r, 20));
  const feature = await fe.renderFeature(scan, z);
  const title = d3.select('.node-title').html('<span></span>');
  renderActHistogram({featureTitleSel: title, scan, featureNode: {featureIndex: z, activation}, featureExamples: fe});
  await new Promise(r => setTimeout(r, 30));
  const text = s => Array.from(document.querySelectorAll(s)).map(e => e.textContent);
  done({index: feature.index, transcoder: feature.transcoder_id, logits: text('.feature-example-logits .token'),
        quantiles: text('.quantile-title'), label: text('.node-title > span')[0],
        bars: document.querySelectorAll('.node-title rect.bar').length,
        marker: document.querySelector('.node-title line')?.getAttribute('x1')});
})().catch(e => done({error: String(e)}));"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver")
@pytest.mark.skipif(FRONTEND is None, reason="circuit-tracer is not installed (scripts/setup.sh installs it)")
@pytest.mark.skipif(not all((JS / n).is_file() for n in LIBS), reason=f"d3-jetpack / pako not in {JS} (setup.sh)")
def test_the_shipped_frontend_shows_the_right_card_for_every_feature(atlas, tmp_path):
    pytest.importorskip("selenium", reason="selenium is not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    _, cfg, _ = atlas
    out = Path(cfg.out)
    root = tmp_path / "site"
    root.mkdir()
    (root / "ct").symlink_to(FRONTEND)
    (root / "lib").symlink_to(JS)
    (root / "cards").symlink_to(out / "exports" / "circuit-tracer")
    (root / "harness.html").write_text(HARNESS, encoding="utf-8")
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        driver.get(f"{base}/harness.html")
        driver.set_script_timeout(20)
        for layer in (1, 2):
            for i in range(64):
                card = _card(out, layer, i)
                activation = card["quantile_values"][49]  # the median: labelled 50pct or below (ties)
                got = driver.execute_async_script(SHOW, "./cards/ffkv", cantor(layer, i), activation)
                assert "error" not in got, (got, driver.get_log("browser"))
                assert (got["index"], got["transcoder"]) == (i, f"{layer}-ffkv")
                assert got["logits"] == card["top_logits"] + card["bottom_logits"]
                assert [t.strip() for t in got["quantiles"]] == [q["quantile_name"] for q in card["examples_quantiles"]]
                assert got["bars"] == HIST_BINS and math.isfinite(float(got["marker"])), got
                match = re.fullmatch(r"Act: -?\d+\.\d\d (\d+)pct, Freq: \d+\.\d{3}%", got["label"])
                assert match and 1 <= int(match.group(1)) <= 50, got["label"]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        urls = []
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
        assert urls and all(u.startswith(base) for u in urls), [u for u in urls if not u.startswith(base)]
    finally:
        driver.quit()
        server.shutdown()
