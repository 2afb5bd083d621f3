"""`python -m wiretape`: the same as the `wiretape` command."""

from .cli import main

main()
