"""Certification protocols: ``tlql`` (this project's) and ``paper`` (the authors').

Each module provides ``evaluation_windows(model, corpus, cfg) -> (tokens, n_documents, n_eligible)``, ``HEADLINE``
(the row key of the bound it reports) and ``ONE_WINDOW_PER_DOCUMENT``;
:func:`~tl_query_lens.certify.protocol.certify_protocol` picks one by ``cfg.protocol``.
"""

from tl_query_lens.certify.protocols import paper, tlql

PROTOCOLS = {"tlql": tlql, "paper": paper}
