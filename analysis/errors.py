"""The one error type of the analysis layer.

An AnalysisError is a problem with the input (an unknown experiment, a metric no
run logged, an empty frontier), not a bug: its message is one line that says what
is wrong and what exists instead, and the CLI prints it and exits with status 2.
It subclasses ValueError so callers that expect ValueError for bad input get it.
"""


class AnalysisError(ValueError):
    pass
