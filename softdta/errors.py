"""The one error hierarchy: every error softdta raises on purpose is a `SoftdtaError`. Its message names the
problem, and its `hint`, when there is one, the fix. The command line catches it once (`softdta.cli.app.main`)
and prints one line, exit status 2, no traceback. Each layer's errors subclass it and keep the built-in base they
had, so callers that catch `ValueError` or `RuntimeError` still do."""


class SoftdtaError(Exception):
    def __init__(self, *args: object, hint: str = "") -> None:
        super().__init__(*args)
        self.hint = hint

    def line(self) -> str:
        """The error as the command line prints it."""
        return f"{self}; {self.hint}" if self.hint else str(self)
