"""Table-1 protocols of the Query Lens evaluation: ``tlql`` (this project's) and ``paper`` (the authors').

Each module provides ``steering(model, view, features, prompts, clean_text, contexts, cfg, k)`` and
``input_scores``; :func:`~tl_query_lens.query_lens.evaluation.evaluate_signatures` picks one by ``cfg.protocol``. The
TC clamp values a protocol fixes are :data:`~tl_query_lens.query_lens.config.PROTOCOL_TC_VALUES` (read by the config).
"""

from tl_query_lens.query_lens.protocols import paper, tlql

PROTOCOLS = {"tlql": tlql, "paper": paper}
