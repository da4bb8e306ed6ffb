"""The one error an export raises for bad input: the CLI prints its message on one line and exits 2."""


class ExportError(ValueError):
    """Input the export cannot honour (unknown format, wrong draft, an engine that cannot load it, ...); the message
    names what is wrong and, where there is one, the way out."""
