"""Reading what an index lists, under the trust rules of docs/INSTALL.md ("What is trusted").

One reader for every byte ``resolve``, ``install``, ``download``, ``index --previous`` and the
sdist backend take from outside: an http(s) URL or a local file, each with

- a deadline for the whole fetch (connect, redirects, headers and body): a server that sends a
  byte a second is cut off when the time is up, not when it stops sending;
- a size limit: the index's recorded size when it gives one, else :data:`MAX_WHEEL_BYTES` for
  a wheel and :data:`MAX_PAGE_BYTES` for an index page or manifest;
- redirects that stay on http(s), at most :data:`MAX_REDIRECTS`;
- retries, within that deadline, of what is often over in a moment: a refused, reset or dropped
  connection and HTTP 429, 500, 502, 503 and 504 (at most :data:`RETRY_DELAYS` more attempts,
  waiting 0.5, 1 and 2 s; a 429 or 503's ``Retry-After`` of up to :data:`MAX_RETRY_AFTER` s
  instead). A connection that keeps being refused is given up after about 3.5 s;
- local files that are regular files (not ``/dev/zero``, a FIFO or a folder), named by a path
  or a ``file:`` URL of this host (``file:///p`` or ``file://localhost/p``).

Every failure is a :class:`FetchError` whose message is one line (without the URL: the caller
names the URL or the argument). Standard library only; no torch.
"""

from __future__ import annotations

import http.client
import math
import os
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from typing import IO, Any, Iterator, Optional, Tuple
from urllib.parse import unquote, urljoin, urlsplit

MAX_WHEEL_BYTES = 1 << 30  # 1 GiB: a full-architecture wheel of ours is about 35 MB
MAX_PAGE_BYTES = 16 << 20  # 16 MiB: a manifest of every wheel ever published is well under 1 MB
MAX_REDIRECTS = 10
MAX_TIMEOUT = 86400.0  # a day: larger values are typos, and sockets refuse infinity
CHUNK = 1 << 16
USER_AGENT = "mamba-kernels"
RETRY_DELAYS = (0.5, 1.0, 2.0)  # the waits before the 2nd, 3rd and 4th attempt to connect
RETRY_STATUS = (429, 500, 502, 503, 504)  # a server busy or restarting, or a proxy before it
MAX_RETRY_AFTER = 30.0  # a longer Retry-After is not waited for: the failure is reported at once


class FetchError(Exception):
    """A fetch failed; ``kind`` is "timeout", "http", "network", "size", "scheme" or "file"."""

    def __init__(self, line: str, kind: str, status: Optional[int] = None) -> None:
        super().__init__(" ".join(line.split()))
        self.kind = kind
        self.status = status  # the HTTP status of an HTTP error


def parse_timeout(text: Any, what: str = "--timeout") -> float:
    """Seconds from a command-line or environment value: a finite number above 0 and at most
    :data:`MAX_TIMEOUT`; anything else is a ValueError naming ``what``, the rule and the value."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(f"{what} must be a number of seconds above 0 and at most {MAX_TIMEOUT:.0f}, "
                         f"got {str(text)!r}")
    return value


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def local_path(where: str) -> str:
    """The path a local index entry names: a path as it is, or a ``file:`` URL of this host."""
    if not where.startswith("file:"):
        return where
    parts = urlsplit(where)
    if parts.netloc not in ("", "localhost"):
        raise FetchError(f"the file URL {where!r} names the host {parts.netloc!r}: only file:///path "
                         "(or file://localhost/path) names a file on this machine", "scheme")
    return unquote(parts.path)


class _Watch:
    """The socket of the connection being read, and the deadline's timer that shuts it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.sock: Optional[socket.socket] = None
        self.expired = False
        self.lock = threading.Lock()
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def _expire(self) -> None:
        with self.lock:
            self.expired = True
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read at once
                except OSError:
                    pass

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.expired:
            raise FetchError(f"timed out: the fetch took longer than {self.seconds:.3g} s", "timeout")
        return left

    def attach(self, sock: socket.socket) -> None:
        with self.lock:
            self.sock = sock
            if self.expired:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _opener(watch: _Watch) -> urllib.request.OpenerDirector:
    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            watch.attach(self.sock)

    class SConn(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            watch.attach(self.sock)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> Any:
            return self.do_open(Conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> Any:
            return self.do_open(SConn, req, context=self._context)  # type: ignore[attr-defined]

    class Redirects(urllib.request.HTTPRedirectHandler):
        max_redirections = MAX_REDIRECTS

        def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[override]
            new = headers.get("location") or headers.get("uri")
            if new is not None and not is_url(urljoin(req.full_url, new)):
                raise FetchError(f"HTTP {code} redirects to {new!r}, which is not an http(s) URL: "
                                 "redirects may not leave http(s)", "scheme")
            return super().http_error_302(req, fp, code, msg, headers)

        http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    return urllib.request.build_opener(Http, Https, Redirects)


class Stream:
    """The bytes of one URL or local file, read in chunks under a deadline and a size limit.
    ``total`` is the announced (or on-disk) size, ``final`` the URL after redirects."""

    def __init__(self, where: str, timeout: float, limit: int, accept: Optional[str] = None) -> None:
        self.where, self.limit = where, limit
        self.total: Optional[int] = None
        self.content_type = ""
        self.final = where
        self.done = 0
        self._watch: Optional[_Watch] = None
        self._src: Optional[IO[bytes]] = None
        if is_url(where):
            self._open_url(where, timeout, accept)
        else:
            self._open_file(local_path(where))
        if self.total is not None and self.total > limit:
            self.close()
            raise FetchError(f"is {self.total} bytes, above the limit of {limit} bytes", "size")

    def _open_url(self, url: str, timeout: float, accept: Optional[str]) -> None:
        watch = self._watch = _Watch(timeout)
        watch.timer.start()
        headers = {"User-Agent": USER_AGENT}
        if accept:
            headers["Accept"] = accept
        start = time.monotonic()
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                r = _opener(watch).open(urllib.request.Request(url, headers=headers),
                                        timeout=watch.remaining())
                break
            except FetchError:
                self.close()
                raise
            except BaseException as e:
                err = _as_fetch_error(e, watch)
                wait = _retry_wait(e, err, attempt)
                if isinstance(e, urllib.error.HTTPError):
                    e.close()
                if wait is None or wait >= watch.deadline - time.monotonic():
                    self.close()
                    if attempt and isinstance(err, FetchError):
                        took = time.monotonic() - start
                        err = FetchError(f"{err} ({attempt + 1} attempts in {took:.1f} s)", err.kind,
                                         err.status)
                    raise err from None
                time.sleep(wait)
        self._src = r
        self.content_type = r.headers.get("Content-Type", "") or ""
        self.final = r.geturl()
        length = (r.headers.get("Content-Length") or "").strip()
        self.total = int(length) if length.isdigit() else None

    def _open_file(self, path: str) -> None:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise FetchError(f"cannot be read: {e.strerror or e}", "file") from None
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            f.close()
            raise FetchError("is not a regular file (a device, a pipe or a folder)", "file")
        self._src, self.total = f, st.st_size

    def chunks(self) -> Iterator[bytes]:
        assert self._src is not None
        read = getattr(self._src, "read1", self._src.read)  # what has arrived, for progress lines
        while True:
            try:
                if self._watch is not None:
                    self._watch.remaining()
                chunk = read(CHUNK)
            except FetchError:
                raise
            except Exception as e:
                raise _as_fetch_error(e, self._watch) from None
            if not chunk:
                if self._watch is not None:
                    self._watch.remaining()  # a read cut short by the deadline reads as the end
                break
            self.done += len(chunk)
            if self.done > self.limit:
                raise FetchError(f"sent more than the limit of {self.limit} bytes", "size")
            yield chunk
        if self.total is not None and self.done != self.total:
            raise FetchError(f"truncated: {self.done} of the {self.total} bytes announced", "network")

    def close(self) -> None:
        if self._watch is not None:
            self._watch.timer.cancel()
        if self._src is not None:
            try:
                self._src.close()
            except Exception:
                pass
            self._src = None

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _retry_wait(e: BaseException, err: BaseException, attempt: int) -> Optional[float]:
    """Seconds to wait before trying again after ``e`` (``err`` as a FetchError), or None: the
    failure is not a passing one, or the attempts are used up."""
    if not isinstance(err, FetchError) or err.kind == "timeout" or attempt >= len(RETRY_DELAYS):
        return None
    if isinstance(e, urllib.error.HTTPError):
        if e.code not in RETRY_STATUS:
            return None
        after = (e.headers.get("Retry-After") or "").strip() if e.headers is not None else ""
        if e.code in (429, 503) and after:
            try:
                seconds = float(after)
            except ValueError:  # an HTTP date: waited for as the usual backoff
                return RETRY_DELAYS[attempt]
            return max(seconds, 0.0) if math.isfinite(seconds) and seconds <= MAX_RETRY_AFTER else None
        return RETRY_DELAYS[attempt]
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine)):
        return RETRY_DELAYS[attempt]
    if isinstance(reason, socket.gaierror) and reason.errno == getattr(socket, "EAI_AGAIN", None):
        return RETRY_DELAYS[attempt]  # "temporary failure in name resolution"
    return None


def _as_fetch_error(e: BaseException, watch: Optional[_Watch], done: int = 0,
                    total: Optional[int] = None) -> BaseException:
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return e
    after = f" after {done} of {total if total is not None else '?'} bytes" if done else ""
    if watch is not None and (watch.expired or time.monotonic() >= watch.deadline):
        return FetchError(f"timed out{after}: the fetch took longer than {watch.seconds:.3g} s", "timeout")
    if isinstance(e, urllib.error.HTTPError):
        if 300 <= e.code < 400:
            return FetchError(f"HTTP {e.code}: too many redirects (more than {MAX_REDIRECTS}, or a loop)",
                              "http")
        return FetchError(f"HTTP {e.code} {e.reason}", "http", e.code)
    if isinstance(e, urllib.error.URLError):
        reason = e.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return FetchError(f"timed out{after}", "timeout")
        return FetchError(f"cannot be fetched: {reason}", "network")
    if isinstance(e, (TimeoutError, socket.timeout)):
        return FetchError(f"timed out{after}", "timeout")
    return FetchError(f"cannot be fetched{after}: {e or type(e).__name__}", "network")


def read_all(where: str, timeout: float, limit: int = MAX_PAGE_BYTES, accept: Optional[str] = None
             ) -> Tuple[bytes, str, str]:
    """(body, content type, final URL) of an index page or manifest, read whole under the limits."""
    with Stream(where, timeout, limit, accept) as s:
        body = b"".join(s.chunks())
        return body, s.content_type, s.final
