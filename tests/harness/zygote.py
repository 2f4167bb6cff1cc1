"""``python -m scrapy ...`` processes forked from one that has already imported Scrapy.

A ``scrapy crawl`` worker spends about 0.5 of its 0.7 CPU-seconds of start importing
Scrapy, Twisted and this package, and the suite starts some 300 of them on a 2-core
machine (docs/development.md). The tests start theirs from a *zygote*: one process a
pytest worker, which imports those modules once (never a reactor, never a thread) and
forks a child for each command. The child then does what ``python -m scrapy`` does
after its imports: the command's environment, working directory, ``sys.path`` and
``sys.argv``, standard streams on the files or pipes given, Scrapy's ``__main__`` run
as the main module, and a normal interpreter exit (``atexit`` handlers, the last
garbage collection and its "Task exception was never retrieved" lines included).
Each child is a process of its own, stopped by its PID.

What differs from an exec'd process: the child's parent is the zygote, so its exit
status comes from the zygote (:class:`Forked` is a ``Popen`` with what the tests use
of it); the modules imported before the fork are the zygote's (a ``sitecustomize``
or an interpreter option of the command would not take: :func:`forkable` sends those
commands to ``subprocess``). ``random`` is reseeded in every child (CPython does at
fork); ``str`` hashes share the zygote's seed.

``FORK = False`` in this module (or ``BLOOMDUPE_TEST_EXEC=1`` in the environment)
starts every command with ``subprocess`` instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

#: Fork commands (else ``subprocess``): the tests' conftest turns it on.
FORK = False

#: What the zygote imports: Scrapy's crawl command and the components of a default
#: crawl, this package's, scrapy-redis's and redis-py's. None of them installs a
#: reactor (checked at start).
PRELOAD = (
    "scrapy.cmdline", "scrapy.commands.crawl", "scrapy.crawler", "scrapy.core.engine",
    "scrapy.core.scraper", "scrapy.core.downloader", "scrapy.core.downloader.handlers.http11",
    "scrapy.http", "scrapy.linkextractors", "scrapy.settings.default_settings",
    "scrapy.utils.reactor", "twisted.internet.asyncioreactor", "lxml.html", "parsel",
    "redis", "redis.asyncio", "redis.cluster", "scrapy_redis.scheduler",
    "scrapy_redis.queue", "scrapy_bloomdupe.addon", "scrapy_bloomdupe.scheduler",
    "scrapy_bloomdupe.dupefilter", "scrapy_bloomdupe.middleware",
    "scrapy_bloomdupe.workermetrics", "scrapy_bloomdupe.commands.bloomdupe",
)
#: Environment variables the interpreter reads at its start that a child takes on
#: itself; any other ``PYTHON*`` variable that differs from the zygote's sends the
#: command to ``subprocess``.
TAKEN_ON = {"PYTHONPATH", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE"}


# -- the zygote ----------------------------------------------------------------------------


def _preload() -> None:
    from scrapy.settings import default_settings
    from scrapy.utils.misc import load_object

    for name in PRELOAD:
        __import__(name)
    for components in (default_settings.DOWNLOADER_MIDDLEWARES_BASE,
                       default_settings.SPIDER_MIDDLEWARES_BASE,
                       default_settings.EXTENSIONS_BASE):
        for path in components:
            load_object(path)
    if "twisted.internet.reactor" in sys.modules:
        raise SystemExit("zygote: a preloaded module installed a reactor")
    if threading.active_count() != 1:
        raise SystemExit("zygote: a preloaded module started a thread")


def serve(fd: int) -> None:
    """The zygote's loop: a request (JSON, and the child's stdin, stdout and stderr as
    SCM_RIGHTS) forks a child; its PID goes back, and its exit status when reaped. Ends
    when the client closes its end."""
    sock = socket.socket(fileno=fd)
    _preload()
    base_path = sys.path[1:]  # without this file's folder
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the client closes the socket
    while True:
        try:
            ready, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # The child: never back into this loop. SystemExit (Scrapy's exit) or any
            # other exception unwinds to the interpreter's normal end.
            sock.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            _become(request, fds, base_path)
        for child_fd in fds:
            os.close(child_fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}
                             ).encode())


def _become(request: dict[str, Any], fds: list[int], base_path: list[str]) -> None:
    """In the child: what ``python -m scrapy ARGS`` is after its imports."""
    import faulthandler
    import runpy

    for signum in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, child_fd in enumerate(fds):
        os.dup2(child_fd, target)
        os.close(child_fd)
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *path, *base_path]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    sys.argv = [request["argv"][2], *request["argv"][3:]]
    runpy.run_module(request["argv"][2], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


# -- the client ----------------------------------------------------------------------------


class Forked:
    """A forked command, with what the tests use of ``subprocess.Popen``."""

    def __init__(self, args: Sequence[str], pid: int, stdout: IO[Any] | None,
                 stderr: IO[Any] | None) -> None:
        self.args = list(args)
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class Zygote:
    """The client of one zygote process (this process's: :func:`zygote`)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, env=env, cwd=Path(__file__).parent)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        #: One spawn at a time: the zygote answers each with its child's PID, in order.
        self.spawning = threading.Lock()
        self.pids: queue.Queue[int] = queue.Queue()
        self.children: dict[int, Forked] = {}
        self.early: dict[int, int] = {}  # exits read before their child was registered
        threading.Thread(target=self._read, name="zygote", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self.sock.recv(1 << 16)
            except OSError:
                return
            if not message:
                return
            answer = json.loads(message)
            if "pid" in answer:
                self.pids.put(answer["pid"])
                continue
            with self.lock:
                child = self.children.pop(answer["exit"], None)
                if child is None:
                    self.early[answer["exit"]] = answer["code"]
                else:
                    child._exited(answer["code"])

    def spawn(self, args: Sequence[str], *, cwd: str | Path, env: dict[str, str],
              stdin: Any = None, stdout: Any = None, stderr: Any = None) -> Forked:
        """Fork ``args`` (``[python, "-m", module, ...]``); ``stdin``, ``stdout`` and
        ``stderr`` as ``Popen`` takes them (a file, ``PIPE``, ``DEVNULL``,
        ``STDOUT`` for stderr, or None: this process's)."""
        keep: list[IO[Any] | None] = [None, None]
        sent: list[int] = []
        to_close: list[int] = []

        def fd_for(stream: Any, index: int) -> int:
            if stream is None:
                return index
            if stream == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                to_close.append(fd)
                return fd
            if stream == subprocess.PIPE:
                read, write = os.pipe()
                keep[index - 1] = open(read, "rb")  # noqa: SIM115 - the caller closes it
                to_close.append(write)
                return write
            if stream == subprocess.STDOUT:
                return sent[1]
            return int(stream.fileno())

        for index, stream in enumerate((stdin, stdout, stderr)):
            sent.append(fd_for(stream, index))
        with self.spawning:
            try:
                socket.send_fds(self.sock, [json.dumps(
                    {"argv": list(args), "cwd": str(cwd), "env": env}).encode()], sent)
            finally:
                for fd in to_close:
                    os.close(fd)
            try:
                pid = self.pids.get(timeout=180)  # a guard: a loaded CI took over 30 s
            except queue.Empty:
                # Its late answer would be taken as the next spawn's PID (ciI's floor lane:
                # 7 commands got another's result): the next spawn gets a fresh zygote.
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"zygote: no answer to {args!r}") from None
        child = Forked(args, pid, keep[0], keep[1])
        with self.lock:
            if pid in self.early:
                child._exited(self.early.pop(pid))
            else:
                self.children[pid] = child
        return child

    def close(self) -> None:
        self.sock.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote, started on first use and stopped at exit."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = Zygote()
            atexit.register(_zygote.close)
        return _zygote


def forkable(args: Sequence[str], env: dict[str, str]) -> bool:
    """Whether ``args`` may be forked: ``python -m scrapy ...`` with this interpreter,
    no ``sitecustomize`` on its ``PYTHONPATH`` and no other interpreter setting."""
    if not FORK or os.environ.get("BLOOMDUPE_TEST_EXEC") == "1":
        return False
    if list(args[:3]) != [sys.executable, "-m", "scrapy"]:
        return False
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "sitecustomize.py").exists():
            return False
    start = zygote().env
    return all(env.get(name) == start.get(name)
               for name in {*env, *start} if name.startswith("PYTHON") and name not in TAKEN_ON)


def popen(args: Sequence[str], *, cwd: str | Path, env: dict[str, str] | None = None,
          stdin: Any = None, stdout: Any = None, stderr: Any = None,
          ) -> subprocess.Popen[bytes] | Forked:
    """``subprocess.Popen(args, ...)``, forked from the zygote where :func:`forkable`."""
    env = dict(os.environ) if env is None else env
    if forkable(args, env):
        return zygote().spawn(args, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                              stderr=stderr)
    return subprocess.Popen(args, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                            stderr=stderr)


def run(args: Sequence[str], *, cwd: str | Path, env: dict[str, str] | None = None,
        input: str = "", timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True, input=input,
    timeout=timeout)``, forked from the zygote where :func:`forkable` (the output
    through files: no pipe to drain)."""
    env = dict(os.environ) if env is None else env
    if not forkable(args, env):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                              input=input, timeout=timeout)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        fin.write(input.encode())
        fin.seek(0)
        child = zygote().spawn(args, cwd=cwd, env=env, stdin=fin, stdout=out, stderr=err)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        texts = []
        for stream in (out, err):
            stream.seek(0)
            texts.append(stream.read().decode(errors="replace"))
    return subprocess.CompletedProcess(list(args), code, *texts)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
