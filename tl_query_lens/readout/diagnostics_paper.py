"""Former home of the readout paper protocol: now :mod:`tl_query_lens.readout.protocols.paper` (its options:
:mod:`tl_query_lens.readout.config`)."""

from tl_query_lens.readout.protocols.paper import (  # noqa: F401  (re-exported)
    PaperReadoutDiagnostics,
    RowMaker,
    _paper_makers,
    _pool,
    contrast_scores,
    random_support_own_magnitudes,
    readout_diagnostics_paper,
    through_origin_r2,
)
