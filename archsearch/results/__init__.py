"""Reading what searches found, for people: the study report (`report`, rendered by `html`).

The reading side of a study is growing (fronts, selection, validation and plots still sit in
`search/` beside the code that runs a search); new reading-side code lives here. This package
imports storage and the search's reading functions, never the other way round, and no torch.
"""
