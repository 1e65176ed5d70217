"""Direct mode through a running daemon: the ``POST /compile`` the full client would send
for a hit, sent over the daemon's Unix socket with the standard library's ``_socket``
(``http.client`` imports ``email``; the daemon speaks HTTP/1.1 with ``Content-Length``
always, docs/daemon.md), after the same trust checks as :mod:`cachemgr.sockcheck`.

What the memo of a daemon-route hit holds besides :mod:`cachemgr.direct`'s checks: the
trusted users, the socket, the digest of the daemon's ``GET /config?sections=1`` answer
(the settings the client prepares with: the same answer, the same preparation), the
body sent (request, base folder, compile environment, inputs: their paths and digests, the
bytes read again here and checked), and the answer received for it.

One round trip: the body goes to ``POST /compile/if-config`` with that digest, and the
daemon compiles only when its own answer to ``GET /config?sections=1`` has that digest
now (:data:`CONFIG_CHANGED`, ``412``, otherwise, with nothing done); a daemon that does not
know the endpoint answers ``404``, also with nothing done. Either way the full path then
runs, as it would without a memo. The answer is decoded by the C scanner behind
:mod:`json` (``_json``: :mod:`json` itself imports :mod:`re`, ~3 ms of start-up). A daemon
that answers otherwise than that hit (a miss, a warning, an error) is reported by the full
path's own code (:class:`cachemgr.direct.Answered`, which :mod:`cachemgr.main` hands to
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
#: The endpoint a direct hit asks, and the body field with the digest of the daemon's
#: settings it was recorded with (:func:`config_digest`).
ENDPOINT = "/compile/if-config"
CONFIG_FIELD = "config_digest"
#: The daemon's status when its settings are not those of ``CONFIG_FIELD`` (nothing done).
CONFIG_CHANGED = 412
#: The statuses of an answer with nothing done: settings changed, an endpoint unknown (a
#: daemon of a version before it). The full path then asks as it would without a memo.
NOTHING_DONE = (CONFIG_CHANGED, 404)


#: Base64 text of the input files (bytes, in all) a memo holds as it is: the body then
#: needs no encoding here (``binascii`` loads ``libz``: ~1 ms of start-up). A larger file's
#: data is a placeholder, encoded when sent. Either way each file is read again and its
#: SHA-256 checked: the bytes recorded are the bytes there now.
EMBEDDED_BYTES = 64 * 1024


def data_placeholder(index: int) -> str:
    """The placeholder of input file ``index``'s base64 data in the body template."""
    return f"\x00data{index}\x00"


def recorded_data(data: list[str]) -> list[str]:
    """What the body template holds for each input file's base64 ``data``: the text itself
    while they fit in :data:`EMBEDDED_BYTES` together (in order), else its placeholder."""
    out, total = [], 0
    for index, text in enumerate(data):
        total += len(text)
        out.append(text if total <= EMBEDDED_BYTES else data_placeholder(index))
    return out


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
    """The ``POST /compile/if-config`` body: the recorded template with a new session, the
    digest of the daemon's settings it was recorded with, and the input files' bytes, read
    again and checked against their digests (their base64 put in where the template holds
    a placeholder).

    :raises direct.Decline: a file changed or cannot be read.
    """
    text: str = memo["body"]
    if not text.endswith("}") or not _plain_hex(memo["config_answer"]):
        raise direct.Decline("memo malformed")
    text = text[:-1] + f', "{CONFIG_FIELD}": "{memo["config_answer"]}"}}'
    text = text.replace(_json_str(SESSION), '"' + os.urandom(16).hex() + '"')
    for i, (path, digest) in enumerate(memo["wire_files"]):
        data = _read(path)
        if direct.sha256_hex(data) != digest:
            raise direct.Decline(f"{path} changed")
        placeholder = _json_str(data_placeholder(i))
        if placeholder in text:  # else recorded as it is (:data:`EMBEDDED_BYTES`)
            import binascii

            b64 = binascii.b2a_base64(data, newline=False).decode("ascii")
            text = text.replace(placeholder, '"' + b64 + '"')
    return text.encode("utf-8", "surrogateescape")


def _plain_hex(value: object) -> bool:
    """True for a hex SHA-256 (what the body's digest field may hold as it is)."""
    hexdigits = "0123456789abcdef"
    return isinstance(value, str) and len(value) == 64 and all(c in hexdigits for c in value)


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
    """Ask the daemon of a daemon-route memo, in one request: None (nothing done that
    changes anything) when it is not the daemon and settings the memo was recorded with;
    otherwise the lines to print and the exit code — the recorded hit's, or the full path's
    own report of whatever else the daemon answered.

    :raises direct.Decline: an input changed, or the socket is not trusted (nothing sent).
    :raises direct.Answered: the daemon answered otherwise than the recorded hit.
    """
    payload = body(memo)
    wire = Wire(memo["socket"], memo["trusted"])
    try:
        try:  # sent: from here on the answer is reported, never asked again
            code, raw = wire.request("POST", ENDPOINT, payload)
        except (OSError, ValueError) as exc:
            return _full_report(memo, None, b"", exc)
    finally:
        wire.close()
    if code in NOTHING_DONE:
        return None
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
    """``raw`` decoded as :func:`json.loads` decodes UTF-8 JSON, when it is an object; None
    otherwise (the full path then decodes it itself). With :mod:`json`'s own C scanner
    (``_json.make_scanner``, what :func:`json.loads` runs) when the interpreter has it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        got, end = _scanner()(text, start)
    except (ValueError, StopIteration, RecursionError):
        return None
    if text[end:].strip(_JSON_SPACE):
        return None
    return got if isinstance(got, dict) else None


#: The whitespace JSON allows around a value.
_JSON_SPACE = " \t\n\r"


def _scanner() -> Any:
    """``scan(text, index) -> (value, end)``: ``_json.make_scanner`` with
    :class:`json.JSONDecoder`'s defaults (strict strings; ``NaN``, ``Infinity`` and
    ``-Infinity`` as floats), else :mod:`json`'s own decoder's."""
    try:
        import _json
    except ImportError:
        import json

        decoder: Any = json.JSONDecoder()  # its scan_once is set in __init__
        return decoder.scan_once

    class Defaults:
        """The attributes ``make_scanner`` reads of its decoder, as ``JSONDecoder()``'s."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"NaN": float("nan"), "Infinity": float("inf"),
                          "-Infinity": float("-inf")}.__getitem__  # fmt: skip

    defaults: Any = Defaults()
    return _json.make_scanner(defaults)


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
