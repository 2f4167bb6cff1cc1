"""Running a ``bloomdupe`` command (:func:`main`, or Scrapy's :func:`run_project_command`): one
stderr line for a failure a user can fix (exit 0 done, 1 failed, 2 bad usage, 130 interrupted)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import redis
from scrapy.settings import Settings

from ..exceptions import BloomDupeError
from ..transport import diagnose
from . import check, clear, failed, forget, import_, info, keys, metrics, stats, top
from .context import (
    COMMANDS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    Context,
    UsageProblem,
    project_context,
    standalone_context,
)
from .options import PROJECT_OPTIONS, build_parser, standalone_defaults

HANDLERS: dict[str, Callable[[Context, argparse.Namespace], int]] = {
    "info": info.run,
    "stats": stats.run,
    "check": check.run,
    "forget": forget.run,
    "clear": clear.run,
    "failed": failed.run,
    "import": import_.run,
    "keys": keys.run,
    "metrics": metrics.run,
    "top": top.run,
}


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


def execute(command: str, make_context: Callable[[], Context], opts: argparse.Namespace,
            err: TextIO, prog: str = PROG) -> int:
    """Run ``command``; every failure a user can fix becomes one line on stderr."""
    ctx: Context | None = None
    try:
        ctx = make_context()
        diagnose.check(ctx.client)
        return HANDLERS[command](ctx, opts)
    except UsageProblem as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_USAGE
    except BloomDupeError as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_FAILED
    except redis.RedisError as e:
        where = ctx.where if ctx is not None else "?"
        print(f"{prog}: error: Redis at {where}: {type(e).__name__}: {e}", file=err)
        return EXIT_FAILED
    except OSError as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=err)
        return EXIT_INTERRUPTED
    finally:
        if ctx is not None:
            ctx.client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``bloomdupe`` console script."""
    parser = build_parser()
    args = standalone_defaults(parser.parse_args(argv))
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _setup_logging()
    return execute(args.command, lambda: standalone_context(args, sys.stdout, sys.stderr),
                   args, sys.stderr)


def run_project_command(settings: Settings, args: list[str], opts: argparse.Namespace,
                        out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``scrapy bloomdupe COMMAND [SPIDER] [URL...]``; returns the exit status. Raises
    :class:`UsageProblem` for a bad command line (the caller shows usage)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if not args:
        raise UsageProblem(f"give a command: {', '.join(COMMANDS)}")
    command, rest = args[0], list(args[1:])
    if command not in COMMANDS:
        raise UsageProblem(f"unknown command {command!r}: use one of {', '.join(COMMANDS)}")
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        raise UsageProblem(f"unknown option(s) {' '.join(unknown)}")
    for dest, (option, default, commands) in PROJECT_OPTIONS.items():
        if getattr(opts, dest, default) != default and command not in commands:
            raise UsageProblem(f"{option} applies to {' and '.join(commands)} only")
    spider: str | None = None
    if opts.key is None:
        if not rest:
            raise UsageProblem(f"which spider's filter? scrapy bloomdupe {command} SPIDER "
                               "(or --key KEY)")
        spider = rest.pop(0)
    if command == "check":
        if not rest:
            raise UsageProblem("check which URLs? scrapy bloomdupe check SPIDER URL [URL ...]")
        opts.urls = rest
    elif command == "forget":
        if not rest and not opts.file:
            raise UsageProblem("forget which URLs? scrapy bloomdupe forget SPIDER URL [URL ...] "
                               "(or --file FILE)")
        opts.urls = rest
    elif rest:
        raise UsageProblem(f"unexpected argument(s) for {command}: {' '.join(rest)}")
    if command == "metrics" and opts.port is None:
        raise UsageProblem("metrics needs --port PORT (0: any free port)")
    if command == "import":
        opts.capacity = opts.error_rate = None
        opts.settings = []
    _setup_logging()
    key = opts.key
    return execute(command, lambda: project_context(settings, spider, key, opts.json, out, err),
                   opts, err, prog="scrapy bloomdupe")
