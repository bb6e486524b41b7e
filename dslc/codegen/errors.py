"""The code generator's two exceptions; their messages fit on one line."""


class CodegenError(Exception):
    """Output that cannot be written, or an internal error; the message is one line."""


class Unsupported(CodegenError):
    """A plan that the generator cannot compile (yet); the message names why."""
