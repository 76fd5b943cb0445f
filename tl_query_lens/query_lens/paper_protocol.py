"""Former home of the authors' Table-1 protocol pieces: now :mod:`tl_query_lens.query_lens.protocols.paper`."""

from tl_query_lens.query_lens.protocols.paper import (  # noqa: F401  (re-exported)
    KeyVariant,
    input_scores_paper,
    integer_alphas,
    normalise_token_paper,
    steering_rise,
    up_projection_key_view,
)
