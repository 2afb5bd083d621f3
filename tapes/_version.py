# The one place the version is set: pyproject.toml reads it, and every tape header records it.
VERSION = "0.1.0"
