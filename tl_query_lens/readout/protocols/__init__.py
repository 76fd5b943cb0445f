"""Readout-diagnostics protocols: ``tlql`` (this project's) and ``paper`` (the Sparse Readout Prism authors').

Each module's ``diagnostics(model, sae, states, *, cfg=None, **overrides)`` scores a readout SAE on a
:class:`~tl_query_lens.readout.states.StateBank`; :func:`readout_diagnostics` picks one by ``protocol``. The two
return different results (:class:`~tl_query_lens.readout.evaluate.ReadoutReport`,
:class:`~tl_query_lens.readout.protocols.paper.PaperReadoutDiagnostics`) and take different configs
(``ReadoutEvalConfig``, ``PaperReadoutConfig``), because their pools, states and baselines differ (see each file).
"""

from __future__ import annotations

from typing import Any

from tl_query_lens.protocols import ProtocolName, resolve_protocol
from tl_query_lens.readout.protocols import paper, tlql

PROTOCOLS = {"tlql": tlql, "paper": paper}


def readout_diagnostics(model, sae, states, *, protocol: ProtocolName = "tlql", cfg: Any = None, **overrides: Any):
    """The diagnostics of ``protocol`` (``"tlql"``: :func:`~tl_query_lens.readout.evaluate.evaluate_readout`,
    ``"paper"``: :func:`~tl_query_lens.readout.protocols.paper.readout_diagnostics_paper`)."""
    return PROTOCOLS[resolve_protocol(protocol)].diagnostics(model, sae, states, cfg=cfg, **overrides)
