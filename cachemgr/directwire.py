"""Direct mode through a running daemon: the ``POST /compile`` the full client would send
for a hit, sent over the daemon's Unix socket with the standard library's ``_socket``
(``http.client`` imports ``email``; the daemon speaks HTTP/1.1 with ``Content-Length``
always, docs/daemon.md), after the same trust checks as :mod:`cachemgr.sockcheck`.

What the memo of a daemon-route hit holds besides :mod:`cachemgr.direct`'s checks: the
trusted users, the socket, the digest of the daemon's ``GET /config?sections=1`` answer
(the settings the client prepares with: the same answer, the same preparation), the
body sent (request, base folder, compile environment, inputs: their paths and digests, the
bytes read again here and checked), and the answer received for it. A daemon that answers
otherwise than that hit (a miss, a warning, an error) is reported by the full path's own
code (:class:`cachemgr.direct.Answered`, which :mod:`cachemgr.main` hands to
:func:`cachemgr.cli.compile_cmd.report_daemon_answer`), never asked twice.
"""

from __future__ import annotations

import os
import stat
import sys

from cachemgr import direct

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from typing import Any

#: The largest answer read (bytes).
MAX_ANSWER_BYTES = 64 << 20
#: Seconds a request may take (the CLI's own client waits an hour for a compile).
TIMEOUT_S = 3600.0
#: Placeholders of the body template (JSON strings the recorder put there).
SESSION = "\x00session\x00"


def data_placeholder(index: int) -> str:
    """The placeholder of input file ``index``'s base64 data in the body template."""
    return f"\x00data{index}\x00"


class Wire:
    """One connection to a trusted daemon socket (see the module docstring).

    :raises direct.Decline: the socket, its folder or its process is not trusted, or nothing
        answers: the full path then words it.
    """

    def __init__(self, path: str, trusted: list[int]) -> None:
        import _socket

        self.path = path
        _check_path(path, trusted)
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.sock.settimeout(TIMEOUT_S)
            self.sock.connect(path)
            cred = self.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
            uid = int.from_bytes(cred[4:8], sys.byteorder)  # struct ucred {pid, uid, gid}
            if uid not in trusted:
                raise direct.Decline("socket served by an untrusted user")
        except OSError:
            self.sock.close()
            raise direct.Decline("no daemon answers") from None
        except BaseException:
            self.sock.close()
            raise

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()

    def request(self, method: str, target: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request; its status and body.

        :raises OSError: the connection failed.
        :raises ValueError: the answer is not HTTP/1.x with a ``Content-Length``.
        """
        head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: identity\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode("ascii") + b"\r\n" + (body or b""))
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk or len(buf) > 65536:
                raise ValueError("no HTTP answer")
            buf += chunk
        header, _, rest = buf.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        version, _, code = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError("not HTTP")
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            if name.strip().lower() == "transfer-encoding":
                raise ValueError("encoded answer")
        if length is None or not 0 <= length <= MAX_ANSWER_BYTES:
            raise ValueError("no Content-Length")
        while len(rest) < length:
            chunk = self.sock.recv(min(1 << 20, length - len(rest)))
            if not chunk:
                raise ValueError("answer cut short")
            rest += chunk
        return int(code.split(" ", 1)[0]), rest[:length]


def _check_path(path: str, trusted: list[int]) -> None:
    """:func:`cachemgr.sockcheck.check_path`'s rules: the folder a trusted user's and not
    writable by others unless sticky, the file a socket of a trusted user.

    :raises direct.Decline: any of them does not hold (the full path says which).
    """
    try:
        dst = os.stat(os.path.dirname(path))
        st = os.lstat(path)
    except OSError:
        raise direct.Decline("no socket") from None
    if dst.st_uid not in trusted or (dst.st_mode & 0o022 and not dst.st_mode & stat.S_ISVTX):
        raise direct.Decline("socket folder not trusted")
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in trusted:
        raise direct.Decline("socket not trusted")


def body(memo: dict[str, Any]) -> bytes:
    """The ``POST /compile`` body: the recorded template with a new session and the input
    files' bytes, read again and checked against their digests.

    :raises direct.Decline: a file changed or cannot be read.
    """
    import binascii

    text: str = memo["body"]
    text = text.replace(_json_str(SESSION), '"' + os.urandom(16).hex() + '"')
    for i, (path, digest) in enumerate(memo["wire_files"]):
        data = _read(path)
        if direct.sha256_hex(data) != digest:
            raise direct.Decline(f"{path} changed")
        b64 = binascii.b2a_base64(data, newline=False).decode("ascii")
        text = text.replace(_json_str(data_placeholder(i)), '"' + b64 + '"')
    return text.encode("utf-8", "surrogateescape")


def _json_str(value: str) -> str:
    """``json.dumps(value)`` of a placeholder (NULs escaped as ``\\u0000``)."""
    return '"' + value.replace("\x00", "\\u0000") + '"'


def _read(path: str) -> bytes:
    """The bytes of the regular file ``path`` (non-blocking, capped as an input).

    :raises direct.Decline: it cannot be read so.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise direct.Decline(f"{path}: unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > direct.MAX_INPUT_BYTES:
            raise direct.Decline(f"{path}: not a plain input")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > direct.MAX_INPUT_BYTES:
                raise direct.Decline(f"{path}: too big")
            chunks.append(chunk)
        return bytes(b"".join(chunks))
    except OSError:
        raise direct.Decline(f"{path}: unreadable") from None
    finally:
        os.close(fd)


def answer(memo: dict[str, Any]) -> tuple[list[tuple[bool, str]], int] | None:
    """Ask the daemon of a daemon-route memo: None (nothing sent that changes anything)
    when it is not the daemon and settings the memo was recorded with; otherwise the lines
    to print and the exit code — the recorded hit's, or the full path's own report of
    whatever else the daemon answered."""
    wire = Wire(memo["socket"], memo["trusted"])
    try:
        try:
            code, config = wire.request("GET", "/config?sections=1")
        except (OSError, ValueError):
            return None
        if code != 200 or config_digest(_json_object(config)) != memo["config_answer"]:
            return None
        payload = body(memo)
        try:  # sent: from here on the answer is reported, never asked again
            code, raw = wire.request("POST", "/compile", payload)
        except (OSError, ValueError) as exc:
            return _full_report(memo, None, b"", exc)
    finally:
        wire.close()
    got = _json_object(raw) if code == 200 else None
    if got is None or not isinstance(got.get("seconds"), int | float):
        return _full_report(memo, code, raw, None)
    seconds = float(got.pop("seconds"))
    got["via"] = "daemon"
    if got != memo["answer"]:
        got["seconds"] = seconds
        return _full_report(memo, code, raw, None)
    return [(False, _line(memo, seconds))], 0  # the daemon's seconds, as the full path


def config_digest(answer: dict[str, Any] | None) -> str:
    """The digest of a ``GET /config?sections=1`` answer: of its JSON with sorted keys (the
    recorder has it decoded, by the client; the settings the client prepared with)."""
    import json

    return direct.sha256_hex(json.dumps(answer, sort_keys=True).encode("utf-8"))


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` decoded as a JSON object, None otherwise."""
    import json

    try:
        got = json.loads(raw)
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def _line(memo: dict[str, Any], seconds: float) -> str:
    """The recorded hit's report with the daemon's ``seconds``."""
    doc = memo.get("doc")
    if isinstance(doc, dict):
        import json

        doc = dict(doc)
        doc["seconds"] = round(seconds, 6)
        return json.dumps(doc, ensure_ascii=False)
    kernel, folder, parts = memo["kernel"], memo["chip_dir"], memo["parts"]
    return direct.hit_line(kernel, seconds, folder, parts)


def _full_report(
    memo: dict[str, Any], code: int | None, raw: bytes, error: BaseException | None
) -> tuple[list[tuple[bool, str]], int]:
    """The daemon answered something else than the recorded hit: the full path reports it.

    :raises direct.Answered: always (:mod:`cachemgr.main` hands it to the full path's code).
    """
    raise direct.Answered(memo, code, raw, error)
