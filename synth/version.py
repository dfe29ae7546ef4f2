"""The package's version: one value, read by the facade (``synth.__version__``),
the plan document's ``created_by`` and the command line's ``--version``. A
module of its own so that a stage reads it without importing the facade."""

__version__ = "0.1.0"
