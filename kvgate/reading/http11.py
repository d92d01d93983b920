"""An HTTP/1.1 answer parsed incrementally as its bytes arrive (the wide reader's, kvgate/reading/wideread.py):
status, Location and the body, de-chunked, within a body cap; headers bounded by MAX_HEAD and
chunk-size lines by MAX_CHUNK_LINE, and a compressed answer refused (its size past the cap could not be
bounded).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.reading.httpbounds import cap_text

MAX_HEAD = 64 << 10
#: the most of one chunk-size line (hex size and extensions) a chunked answer may send
MAX_CHUNK_LINE = 1024


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer: its status and its body (de-chunked); `location` is a redirect's target."""

    status: int
    body: bytes
    location: str | None = None


@dataclass(frozen=True)
class Failure:
    """Why no answer came, as a sentence naming the URL."""

    reason: str


class HttpProblem(Exception):
    pass


class Response:
    """An HTTP/1.1 answer parsed incrementally; `feed` and `eof` return the Answer once it is whole."""

    def __init__(self, body_cap: int, cap_name: str = "cap") -> None:
        self.cap = body_cap
        self.cap_name = cap_name
        self.buf = bytearray()
        self.status = 0
        self.body_at = -1  # the body's first byte in buf, once the head is in
        self.length: int | None = None  # Content-Length, when the answer has one
        self.chunked = False
        self.chunk_at = 0  # chunked: where the next chunk-size line starts
        self.body = bytearray()  # chunked: the body decoded so far
        # Not chunked: the body's pieces as they came, joined once when whole. Appended to one buffer, a
        # 16 MiB answer was copied again at every regrowth (about 20 times its size per answer).
        self.parts: list[bytes] = []
        self.have = 0  # bytes in parts
        self.location: str | None = None

    def held(self) -> int:
        """Answer bytes this parser holds now."""
        return len(self.buf) + len(self.body) + self.have

    def release(self) -> None:
        """Drop every buffer (the answer was handed on)."""
        self.buf, self.body, self.parts, self.have = bytearray(), bytearray(), [], 0

    def feed(self, data: bytes) -> Answer | None:
        if self.body_at >= 0 and not self.chunked:
            self.parts.append(data)
            self.have += len(data)
            return self._whole(eof=False)
        self.buf += data
        return self._parse(eof=False)

    def eof(self) -> Answer:
        answer = self._parse(eof=True)
        if answer is None:
            raise HttpProblem("the connection closed before the whole answer arrived")
        return answer

    def _parse(self, *, eof: bool) -> Answer | None:
        if self.body_at < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD:
                if len(self.buf) > MAX_HEAD:
                    raise HttpProblem(f"response headers over {MAX_HEAD >> 10} KiB")
                return None
            self._head(bytes(self.buf[:end]))
            self.body_at = self.chunk_at = end + 4
            if not self.chunked:  # the body's first bytes, come with the head, start the pieces
                first = bytes(memoryview(self.buf)[self.body_at :])
                self.buf = bytearray()
                self.parts = [first] if first else []
                self.have = len(first)
        if self.chunked:
            return self._chunks()
        return self._whole(eof=eof)

    def _whole(self, *, eof: bool) -> Answer | None:
        """The answer once its body is whole: Content-Length bytes, or all bytes to the close."""
        if self.length is not None:
            if self.have < self.length:
                return None
            return Answer(self.status, self._joined()[: self.length], self.location)
        if self.have > self.cap:
            raise self._over()
        return Answer(self.status, self._joined(), self.location) if eof else None

    def _joined(self) -> bytes:
        body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        self.parts = [body]
        return body

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise HttpProblem(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
        self.status = int(status_line[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        encoding = fields.get("content-encoding", "identity").lower()
        if encoding not in ("", "identity"):
            raise HttpProblem(
                f"the answer is compressed (Content-Encoding {encoding[:40]!r}) although identity was asked for: "
                "its size past the cap could not be bounded"
            )
        self.location = fields.get("location")
        if "chunked" in fields.get("transfer-encoding", "").lower():
            self.chunked = True
        elif "content-length" in fields:
            raw = fields["content-length"]
            n = int(raw) if raw.isdigit() else -1
            if n < 0:
                raise HttpProblem(f"malformed Content-Length {raw[:20]!r}")
            if n > self.cap:
                raise HttpProblem(f"the answer announces {n:,} bytes, over kvgate's {self._cap()} (not read)")
            self.length = n

    def _cap(self) -> str:
        return f"{cap_text(self.cap)} cap ({self.cap_name})" if self.cap_name != "cap" else f"{cap_text(self.cap)} cap"

    def _over(self) -> HttpProblem:
        return HttpProblem(f"the answer is larger than kvgate's {self._cap()} (stopped reading)")

    def _chunks(self) -> Answer | None:
        buf = self.buf
        while True:
            eol = buf.find(b"\r\n", self.chunk_at)
            if eol < 0:
                if len(buf) - self.chunk_at > MAX_CHUNK_LINE:
                    raise HttpProblem("malformed chunked encoding")
                return None
            try:
                size = int(bytes(buf[self.chunk_at : eol]).split(b";")[0].strip() or b"x", 16)
            except ValueError:
                raise HttpProblem("malformed chunked encoding") from None
            if size < 0:
                raise HttpProblem("malformed chunked encoding")
            if size == 0:
                return Answer(self.status, bytes(self.body), self.location)
            if len(self.body) + size > self.cap:
                raise self._over()
            start = eol + 2
            if len(buf) < start + size + 2:
                return None
            if buf[start + size : start + size + 2] != b"\r\n":
                raise HttpProblem("malformed chunked encoding")
            self.body += buf[start : start + size]
            del buf[: start + size + 2]  # decoded chunks leave the buffer: no rescans, no double memory
            self.chunk_at = 0
