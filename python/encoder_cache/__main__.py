"""``python -m encoder_cache COMMAND``; the one command is ``simulate``."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from encoder_cache.simulator import cli


class _Parser(argparse.ArgumentParser):
    """Bad command lines get one line on stderr and exit code 2, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m encoder_cache", description="encoder-cache tools")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    simulate = commands.add_parser(
        "simulate",
        help="replay multimodal serving traffic through a vLLM-like scheduler and compare cache managers",
        description="Replay generated multimodal serving traffic through a vLLM-like scheduler with each "
        "chosen encoder-cache manager; report the encoder work and the bookkeeping time.",
    )
    cli.add_arguments(simulate)
    args = parser.parse_args(argv)
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
