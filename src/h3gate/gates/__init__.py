"""The gate kinds, cheap before expensive: the order gate items run in (a generation waits for the model gate's
verdict). Importing this package imports no gate module, so a test session that runs no gate pays nothing for it."""

KINDS = ("kernel", "block", "model", "generation", "power")
