"""The report's feature cards after the atlas fixes: readable byte tokens, a score beside every token, signed module
bars, tables that scroll instead of overflowing, and links into the atlas."""

import re

from tl_query_lens.demo_config import DemoConfig
from tl_query_lens.report.html import FeatureCard, Section, TokenList, build_report
from tl_query_lens.report.tokens import display_token, readable

PIECES = {0: "Ġthe", 1: "âĢ", 2: "Ċ", 3: "é", 4: "ĉ", 5: "<0xE2>"}


class ByteLevelStub:
    """A byte-level BPE vocabulary in GPT-2's printable-byte alphabet: 'Ġ' = space, 'Ċ' = newline."""

    pieces = PIECES

    def convert_ids_to_tokens(self, i):
        return self.pieces[i]

    def decode(self, ids):
        table = {"Ġ": 0x20, "Ċ": 0x0A, "ĉ": 0x09, "â": 0xE2, "Ģ": 0x80, "é": 0xE9}
        piece = self.pieces[ids[0]]
        if piece.startswith("<0x"):
            return "\ufffd"
        data = bytes(table.get(ch, ord(ch)) for ch in piece)
        return data.decode("utf-8", errors="replace")


def test_byte_tokens_and_whitespace_are_readable():
    tok = ByteLevelStub()
    assert display_token(tok, 0) == " the"
    assert display_token(tok, 1) == "<0xE2><0x80>"  # half of a UTF-8 character: its bytes, not "�"
    assert display_token(tok, 2) == "↵" and display_token(tok, 4) == "⇥"
    assert display_token(tok, 3) == "<0xE9>"  # a lone Latin-1 byte is not valid UTF-8 either
    assert display_token(tok, 5) == "<0xE2>"  # SentencePiece byte fallback
    assert readable("") == "∅" and readable("a\x07b") == "a<0x07>b"
    assert display_token(None, 42) == "42"


def test_cards_show_scores_signed_bars_links_and_scrolling_tables(tmp_path):
    card = FeatureCard(
        "layer 18 FF-KV feature 7",
        key_lists=[TokenList("QL_KEY", [" Paris", "\n"], [2.5, -1.25])],
        value_lists=[TokenList("QL_VALUE", [" France"], [1.5])],
        module_shares={"direct": 0.75, "blocks.19.mlp": -0.5},
        link="atlas/index.html#f/18-ffkv/7",
    )
    wide = (["c" + "x" * 30 + str(i) for i in range(20)], [[1.0] * 20])
    page = build_report(tmp_path / "r.html", [Section("S", cards=[card], tables=[wide])]).read_text()
    chips = re.findall(r'<span class="tok[^"]*">([^<]*)</span><span class="score">([^<]*)</span>', page)
    assert (" Paris", "2.5") in chips and ("↵", "-1.25") in chips and (" France", "1.5") in chips
    assert "\\n" not in page.split("<body>")[1]
    bars = re.findall(r"<span class='bar (\w+)' style='width:(\d+)px'>", page)
    assert ("pos", "90") in bars and ("negative", "60") in bars  # width ∝ |share|, colour by sign
    assert "+0.750" in page and "-0.500" in page
    assert '<a href="atlas/index.html#f/18-ffkv/7">' in page
    assert "<div class='scroll'><table>" in page and ".scroll{overflow-x:auto" in page


def test_demo_cards_link_into_an_atlas_of_their_features(tmp_path, monkeypatch):
    from tests.helpers import tiny_model, tiny_tokens
    from tl_query_lens import demo
    from tl_query_lens.atlas import build as atlas_build
    from tl_query_lens.tracking import Tracker

    model = tiny_model("gelu_ln")

    def tokens(source, tokenizer=None, *, n_seqs=64, seq_len=32, split="train", seed=0):
        return tiny_tokens(model, n_seqs=n_seqs, seq_len=min(seq_len, 16), seed=seed)

    monkeypatch.setattr(demo, "load_corpus", tokens)
    monkeypatch.setattr(atlas_build, "load_corpus", tokens)
    cfg = DemoConfig.quick(out=tmp_path, ql_layer=1, n_features=3, atlas_tokens=24 * 64, operator_cache=tmp_path)
    with Tracker(tmp_path / "run", name="t", use_wandb=False) as tracker:
        section, np_path = demo._query_lens_step(model, cfg, tracker)
    assert len(section.cards) == 3
    built = sorted(f["i"] for p in (tmp_path / "atlas" / "shards" / "1-ffkv").glob("*.json") for f in _features(p))
    assert built == list(range(model.cfg.d_mlp))  # every feature of the cards' dictionary: no link to a missing one
    for card in section.cards:
        feature = int(card.title.rsplit(" ", 1)[1])
        assert card.link == f"atlas/index.html#f/1-ffkv/{feature}"
    assert (tmp_path / "atlas" / "index.html").is_file()
    assert np_path == tmp_path / "atlas" / "exports" / "neuronpedia"
    assert (np_path / "v1" / "custom" / "1-ffkv" / "source.jsonl").is_file()


def _features(path):
    import json

    return json.loads(path.read_text())["features"]


def test_report_card_and_atlas_page_show_the_same_module_shares(tmp_path, monkeypatch):
    """One number per thing: the demo's card and an atlas page built with signatures on the same operator corpus give
    a feature the same shares, summed over the same k (two code paths: the demo's signature set, the atlas units)."""
    from types import SimpleNamespace

    from tests.helpers import tiny_model, tiny_tokens
    from tl_query_lens import demo
    from tl_query_lens.atlas import AtlasConfig, build_atlas
    from tl_query_lens.query_lens import QueryLens
    from tl_query_lens.tracking import Tracker

    model = tiny_model("gelu_ln")

    def tokens(source, tokenizer=None, *, n_seqs=64, seq_len=32, split="train", seed=0):
        return tiny_tokens(model, n_seqs=n_seqs, seq_len=min(seq_len, 16), seed=seed)

    monkeypatch.setattr(demo, "load_corpus", tokens)
    monkeypatch.setattr(demo, "build_atlas", lambda *a, **k: SimpleNamespace(out=tmp_path))  # no signatures there
    cfg = DemoConfig.quick(out=tmp_path, ql_layer=1, n_features=3, operator_cache=tmp_path / "ops")
    with Tracker(tmp_path / "run", name="t", use_wandb=False) as tracker:
        section, _ = demo._query_lens_step(model, cfg, tracker)
    cards = {int(c.title.rsplit(" ", 1)[1]): c.module_shares for c in section.cards}
    lens = QueryLens(model, tokens(None, n_seqs=cfg.operator_seqs, seq_len=cfg.seq_len), cache_dir=tmp_path / "ops")
    features = ",".join(map(str, sorted(cards)))
    atlas_cfg = AtlasConfig(out=tmp_path / "atlas", features=features, n_tokens=4 * 16, seq_len=16, k_tokens=3)
    build_atlas(model, ["ffkv:1"], atlas_cfg, tokens=tiny_tokens(model, 4, 16), lens=lens, progress=False)
    pages = {f["i"]: f for p in (tmp_path / "atlas" / "shards" / "1-ffkv").glob("*.json") for f in _features(p)}
    for feature, shares in cards.items():
        page = dict(pages[feature]["shares"])
        assert len(shares) > 1
        for module, value in shares.items():
            assert abs(page[module] - value) <= 1e-3 * max(1.0, abs(value)), (feature, module)
