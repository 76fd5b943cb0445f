"""Protocol names, the same for every method: ``"tlql"`` is this project's own protocol, ``"paper"`` the authors'.

A method that reproduces a paper's table takes ``protocol=`` (a field of its config) and dispatches to
``<method>/protocols/<name>.py``: ``query_lens/protocols``, ``readout/protocols``, ``certify/protocols``. Each of those
files lists, at its top, where it departs from the other. The names the protocols had before they shared one
(``"per-target"``, ``"fixed-pool"``, ``"mixed-layers"``, ``"own-top1"``) are still read as ``"tlql"``.
"""

from __future__ import annotations

from typing import Literal

from tl_query_lens.errors import InputError

OWN = "tlql"
PAPER = "paper"
NAMES: tuple[str, ...] = (OWN, PAPER)
FORMER_NAMES: dict[str, str] = {"per-target": OWN, "fixed-pool": OWN, "mixed-layers": OWN, "own-top1": OWN}
ProtocolName = Literal["tlql", "paper"]


def resolve_protocol(name: str) -> str:
    """``name`` as one of :data:`NAMES` (a former name of the project's own protocol reads as ``"tlql"``).

    Raises:
        InputError: an unknown name (the message lists the valid ones).
    """
    if name in NAMES:
        return name
    if name in FORMER_NAMES:
        return FORMER_NAMES[name]
    raise InputError(
        f"protocol must be one of {list(NAMES)} ('tlql': this project's, 'paper': the authors'), got {name!r}."
    )
