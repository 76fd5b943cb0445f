"""Table-1 protocols of the Query Lens evaluation: ``tlql`` (this project's) and ``paper`` (the authors').

Each module provides ``steering(model, view, features, prompts, clean_text, contexts, cfg, k)``, ``input_scores`` and
``TC_VALUES``; :func:`~tl_query_lens.query_lens.evaluation.evaluate_signatures` picks one by ``cfg.protocol``.
"""

from tl_query_lens.query_lens.protocols import paper, tlql

PROTOCOLS = {"tlql": tlql, "paper": paper}
