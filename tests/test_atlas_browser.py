"""The atlas in real Chromium (Selenium): opens from file://, search within the 300 ms target, a feature page's
contexts, histogram and signature tables, no console errors, no network requests, keyboard navigation.

Skipped only where Chromium, chromedriver or selenium cannot be found (``.ci/run`` installs Debian's chromium and
chromium-driver)."""

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.atlas import AtlasConfig, build_atlas

selenium = pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver")

SEARCH_TARGET_MS = 300


@pytest.fixture(scope="module")
def atlas(tmp_path_factory) -> Path:
    model = tiny_model("gelu_ln")
    out = tmp_path_factory.mktemp("atlas")
    cfg = AtlasConfig(out=out, dictionary=("ffkv:1", "ffkv:2"), n_tokens=40 * 16, seq_len=16, shard_size=32)
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=16)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=tiny_tokens(model, 2, 8, seed=1), progress=False)
    return out


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1400",
        "--disable-ipc-flooding-protection",  # the link walk changes the route hundreds of times a second
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _feature(atlas: Path, slug: str, i: int | str, *, strings: bool = False):
    """Feature ``i`` of ``slug`` from its shard JSON (with the shard's token strings when asked)."""
    for path in (atlas / "shards" / slug).glob("*.json"):
        shard = json.loads(path.read_text())
        found = [f for f in shard["features"] if f["i"] == int(i)]
        if found:
            return (found[0], shard["strings"]) if strings else found[0]
    raise AssertionError(f"{slug}/{i} is not in the atlas")


def _open(browser, atlas: Path, route: str = "") -> None:
    browser.get((atlas / "index.html").as_uri() + route)
    browser.get_log("browser")


def _requests(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _wait(browser, css: str, timeout: float = 5.0):
    from selenium.webdriver.common.by import By

    end = time.time() + timeout
    while time.time() < end:
        found = browser.find_elements(By.CSS_SELECTOR, css)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{css} did not appear")


def test_index_loads_from_file_url_with_every_dictionary(browser, atlas):
    _open(browser, atlas)
    table = _wait(browser, "#dictionaries")[0].text
    assert "ffkv L1" in table and "ffkv L2" in table and "64 / 64" in table


def test_token_search_answers_within_the_target(browser, atlas):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    shard = json.loads((atlas / "shards" / "1-ffkv" / "0.json").read_text())
    feature = shard["features"][5]
    token = shard["strings"][feature["sig"]["QL_VALUE"]["top"][0][0]]  # a token this feature promotes most
    _open(browser, atlas)
    box = browser.find_element(By.ID, "search")
    box.send_keys(token, Keys.ENTER)
    links = [a.get_attribute("href") for a in _wait(browser, "#results a")]
    assert any(h.endswith("#f/1-ffkv/5") for h in links)
    previews = _wait(browser, "#results li .preview .snippet")  # each result: its top tokens and best context
    expected, strings = _feature(atlas, *links[0].split("#f/")[1].split("/", 1), strings=True)
    first = browser.find_elements(By.CSS_SELECTOR, "#results li")[0]
    chips = [c.text for c in first.find_elements(By.CSS_SELECTOR, ".peaks .chip")]
    top = expected["top"][0]
    assert chips and chips[0] == strings[top["t"][top["m"]]].strip() and previews
    elapsed = browser.execute_script("return window.ATLAS_LAST_SEARCH_MS")
    assert elapsed < SEARCH_TARGET_MS
    in_page = browser.execute_script(
        f"var t=performance.now(); ATLAS.runSearch({json.dumps(token)}); return performance.now()-t"
    )
    assert in_page < SEARCH_TARGET_MS


def test_feature_page_shows_contexts_histogram_and_signatures(browser, atlas):
    from selenium.webdriver.common.by import By

    _open(browser, atlas, "#f/1-ffkv/5")
    contexts = _wait(browser, "#top-contexts .ctx")
    assert len(contexts) >= 5
    colours = browser.execute_script(
        "return Array.from(document.querySelectorAll('#top-contexts .ctx span.t.peak'))"
        ".map(s => getComputedStyle(s).backgroundColor)"
    )
    assert len(colours) == len(contexts) and all(
        c.startswith(("rgba(255, 140, 0", "rgb(255, 140, 0")) for c in colours
    )  # peaks shaded
    hist = _feature(atlas, "1-ffkv", 5)["hist"]
    counts = hist["counts"] + hist.get("neg", {"counts": []})["counts"]
    bars = browser.execute_script(
        "return Array.from(document.querySelectorAll('#hist rect')).map(r => [r.getAttribute('class'), +r.dataset.count])"
    )
    assert sorted(c for _, c in bars) == sorted(counts) and sum(counts) > 0  # one bar per bin, its count
    assert [k for k, _ in bars].count("neg") == len(hist.get("neg", {"counts": []})["counts"]) > 0  # GELU: signed
    ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#hist .yaxis text")]
    assert str(max(counts)) in ticks and "0" in ticks and "count" in ticks  # a count axis
    value = browser.find_element(By.ID, "value-top").text
    assert "LL_VALUE" in value and "QL_VALUE" in value and "QL_INDIRECT" in value
    assert "QL_KEY" in browser.find_element(By.ID, "key-top").text
    assert browser.find_elements(By.CSS_SELECTOR, "#value-top .score")  # a value beside every token
    assert browser.find_elements(By.CSS_SELECTOR, "#shares tr")


def test_no_console_errors_and_no_network_requests(browser, atlas):
    _open(browser, atlas)
    browser.get_log("performance")
    for route in ("", "#d/1-ffkv", "#f/2-ffkv/7", "#q/3", "#f/1-ffkv/63"):
        browser.get((atlas / "index.html").as_uri() + route)
        time.sleep(0.2)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    off_disk = [u for u in _requests(browser) if not u.startswith("file://")]
    assert off_disk == []


def test_keyboard_navigation(browser, atlas):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    def until(condition, what):  # poll instead of sleeping: the CI machine may be loaded
        WebDriverWait(browser, 15).until(lambda b: condition(), message=what)

    _open(browser, atlas, "#f/1-ffkv/5")
    _wait(browser, "#top-contexts .ctx")
    # A hash change does not reload the page: focus may still be in the search box from an earlier test, where the
    # arrow keys move the caret instead of the page. Start from the page itself, as a reader who clicked on it.
    browser.execute_script("if (document.activeElement) document.activeElement.blur();")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    until(lambda: browser.current_url.endswith("#f/1-ffkv/6"), "→ goes to the next feature")
    _wait(browser, "h1")
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    until(lambda: browser.current_url.endswith("#f/1-ffkv/5"), "← goes back")
    ActionChains(browser).send_keys("/").perform()
    until(lambda: browser.switch_to.active_element.get_attribute("id") == "search", "/ focuses the search box")
    ActionChains(browser).send_keys("1-ffkv/9").perform()
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    until(lambda: browser.find_elements(By.CSS_SELECTOR, "main a[href$='#f/1-ffkv/9']"), "Enter shows the feature")
    _open(browser, atlas, "#q/3")
    _wait(browser, "#results a")
    browser.find_element(By.ID, "search").click()
    ActionChains(browser).send_keys(Keys.ARROW_DOWN, Keys.ARROW_DOWN).perform()
    second = browser.find_elements(By.CSS_SELECTOR, "#results a")[1].get_attribute("href")
    until(lambda: browser.switch_to.active_element.get_attribute("href") == second, "↓↓ focuses the second result")
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    _wait(browser, "#top-contexts")
    assert "#f/" in browser.current_url


DEAD_ENDS = ("not in its data file", "not in this atlas", "Missing data file", "No dictionary")


@pytest.fixture(scope="module")
def sparse_atlas(tmp_path_factory) -> Path:
    """Built features that are neither consecutive nor one shard per range: the case of the demo's atlas."""
    model = tiny_model("gelu_ln")
    out = tmp_path_factory.mktemp("sparse")
    cfg = AtlasConfig(
        out=out,
        dictionary=("ffkv:1", "ffkv:2"),
        features="1,3,4,9-12,30,63",
        n_tokens=8 * 16,
        seq_len=16,
        shard_size=3,
        signatures=False,
    )
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=16)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=tiny_tokens(model, 2, 8, seed=1), progress=False)
    return out


# One route per call: go there, wait until the page shows it, return its text and its in-page links.
_VISIT = """
const [route, hashed, done] = arguments;
location.hash = route;
const end = Date.now() + 15000;  // a shard's first load, on a loaded machine
(function poll() {
  const main = document.getElementById("main");
  if (main && main.getAttribute("data-route") === hashed) {
    const links = Array.from(document.querySelectorAll('a[href^="#"]')).map(a => a.getAttribute("href"));
    done([main.innerText, links]);
  } else if (Date.now() > end) {
    done([null, main ? main.getAttribute("data-route") : null]);
  } else {
    setTimeout(poll, 5);
  }
})();
"""


def _walk(browser, atlas: Path, page_size: int) -> dict[str, str]:
    """Every in-page link reachable from the home page, visited once; route → the text its page shows."""
    _open(browser, atlas)
    _wait(browser, "#dictionaries")
    browser.execute_script(f"ATLAS.setPageSize({page_size});")
    seen: dict[str, str] = {}
    todo = ["#"]
    while todo:
        route = todo.pop()
        if route in seen:
            continue
        text, hrefs = browser.execute_async_script(_VISIT, route, "" if route == "#" else route)
        assert text is not None, f"{route} did not show within 15 s (the page shows {hrefs!r})"
        seen[route] = text
        todo.extend(h for h in hrefs if h not in seen)
    return seen


def test_every_link_of_an_atlas_leads_to_a_built_feature(browser, sparse_atlas):
    pages = _walk(browser, sparse_atlas, page_size=4)
    dead = {route: text for route, text in pages.items() if any(s in text for s in DEAD_ENDS)}
    assert dead == {}
    built = [1, 3, 4, 9, 10, 11, 12, 30, 63]
    for slug in ("1-ffkv", "2-ffkv"):
        assert {r for r in pages if r.startswith(f"#f/{slug}/")} == {f"#f/{slug}/{i}" for i in built}
        pager = {f"#d/{slug}", f"#d/{slug}/1", f"#d/{slug}/2"}  # 9 features, 4 a page
        assert {r for r in pages if r.startswith(f"#d/{slug}")} == pager
    assert "← 4" in pages["#f/1-ffkv/9"] and "10 →" in pages["#f/1-ffkv/9"]  # ← / → step through built features
    assert "← 30" in pages["#f/1-ffkv/63"] and "→" not in pages["#f/1-ffkv/63"].split("\n")[0]


@pytest.mark.slow
def test_every_link_of_the_quick_demo_atlas_leads_to_a_built_feature(browser, demo_quick_atlas):
    """The same walk over the atlas ``tlql demo --quick`` builds: its dictionary pages (512 a page) and every feature."""
    atlas, slug, d_mlp = demo_quick_atlas
    pages = _walk(browser, atlas, page_size=512)
    dead = {route: text[:200] for route, text in pages.items() if any(s in text for s in DEAD_ENDS)}
    assert dead == {}
    assert {r for r in pages if r.startswith("#f/")} == {f"#f/{slug}/{i}" for i in range(d_mlp)}
    assert {r for r in pages if r.startswith("#d/")} == {f"#d/{slug}"} | {f"#d/{slug}/{n}" for n in (1, 2)}
    assert "← 320" in pages[f"#f/{slug}/321"] and "322 →" in pages[f"#f/{slug}/321"]
