"""`python -m training prepare|train|eval`: regenerate data with the target, train drafts, measure them."""
