"""The exception types of the analysis package (kept apart so light commands skip pandas)."""


class AnalysisInputError(ValueError):
    """Input the analysis cannot use; the message names the problem in one line."""


class SingleSeedError(AnalysisInputError):
    """No point has repeated seeds, so seed noise is unknown (pass a known seed std instead)."""
