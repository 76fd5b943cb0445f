"""The report's feature cards after the atlas fixes: readable byte tokens, a score beside every token, signed module
bars, tables that scroll instead of overflowing, and links into the atlas."""

import re

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
