"""The one exception type of the analysis package (kept apart so light commands skip pandas)."""


class AnalysisInputError(ValueError):
    """Input the analysis cannot use; the message names the problem in one line."""
