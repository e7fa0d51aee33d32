"""Request bodies: size limit and Content-Encoding (the TypeSafe SDK zstd-compresses bodies >= 1 KB)."""

from __future__ import annotations

import io
import zlib

import zstandard

from basal.core.errors import RequestError


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Decode gzip / deflate / zstd bodies, refusing anything that inflates past `limit` bytes (413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    try:
        if encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)  # 47: gzip or zlib header
            out = d.decompress(body, limit + 1)
        elif encoding == "zstd":
            parts, size = [], 0
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
                while size <= limit:  # never inflate past the limit (decompression bombs)
                    part = reader.read(min(1 << 20, limit + 1 - size))
                    if not part:
                        break
                    parts.append(part)
                    size += len(part)
            out = b"".join(parts)
        else:
            raise RequestError(
                415, {"detail": f"Unsupported Content-Encoding: {encoding}. Send identity, gzip, deflate or zstd."}
            )
    except (zlib.error, zstandard.ZstdError) as e:
        raise RequestError(400, {"detail": f"The body is not valid {encoding} data: {e}"}) from e
    if len(out) > limit:
        raise RequestError(413, {"detail": f"The decompressed body is larger than {limit} bytes."})
    return out
