"""Token strings a reader can see: byte-level pieces, whitespace and control characters made visible.

A byte-level BPE token that is only part of a UTF-8 character decodes to U+FFFD ("�"), and whitespace tokens decode
to nothing visible. :func:`display_tokens` gives each id a readable string instead: the decoded text where it is
valid, else the token's bytes written as ``<0xE2><0x80>``; spaces stay spaces, newlines become ``↵``, tabs ``⇥``,
other control characters ``<0x07>``, and an empty token ``∅``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (the printable characters byte-level BPE vocabularies use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def readable(text: str) -> str:
    """``text`` with newlines, tabs and other control characters made visible (never empty)."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"<0x{ord(ch):02X}>")
        else:
            out.append(ch)
    return "".join(out) or "∅"


def _bytes_of(piece: str) -> bytes | None:
    """The bytes of a byte-level BPE piece (None when it is not one)."""
    table = _byte_decoder()
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte fallback
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    if all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    return None


def display_token(tokenizer, token_id: int) -> str:
    """One token as a reader should see it (see the module docstring); ``str(id)`` without a tokenizer."""
    if tokenizer is None:
        return str(int(token_id))
    text = tokenizer.decode([int(token_id)])
    if "\ufffd" not in text:
        return readable(text)
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    raw = _bytes_of(piece) if isinstance(piece, str) else None
    if raw is None:
        return readable(text)
    parts, rest = [], raw
    while rest:  # valid UTF-8 runs as text, the rest as <0x..>
        for end in range(len(rest), 0, -1):
            try:
                parts.append(readable(rest[:end].decode("utf-8")))
                rest = rest[end:]
                break
            except UnicodeDecodeError:
                continue
        else:
            parts.append(f"<0x{rest[0]:02X}>")
            rest = rest[1:]
    return "".join(parts)


def display_tokens(tokenizer, ids: Iterable[int]) -> list[str]:
    """:func:`display_token` of each id."""
    return [display_token(tokenizer, i) for i in ids]
