"""Query Lens: key and value signatures of dictionary features, their Table-1 evaluation, subspace channels."""
