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
    parser = _Parser(prog="encoder_cache", description="encoder-cache tools", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    simulate = commands.add_parser(
        "simulate",
        prog=cli.PROG,
        allow_abbrev=False,
        help="replay multimodal serving traffic through a vLLM-like scheduler: which eviction policy, how much cache",
        description="Replay multimodal serving traffic (a built-in workload or your --trace) through a vLLM-like "
        "scheduler with each encoder-cache eviction policy and size; report the encoder work and its GPU time, "
        "and recommend a policy and a size. See docs/simulator.md.",
    )
    cli.add_arguments(simulate)
    args, extras = parser.parse_known_args(argv)
    if extras:  # reported by the command's parser, under its name
        simulate.error(f"unrecognized arguments: {' '.join(extras)}")
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
