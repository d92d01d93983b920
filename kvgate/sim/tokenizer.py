"""A reversible byte-level tokenizer: token id = byte value.

Ids 0..255 are bytes; id 0 doubles as the pad/placeholder token (SGLang's rejected requests carry a
one-token input `[0]`, see `Req.set_finish_with_abort`), so the toy model skips it when reading KV.
Ids >= 256 are accepted in `input_ids` (SGLang does not bound them at the HTTP layer) and
detokenize to U+FFFD, so text prompts, input_ids and sentinels made of printable bytes round-trip.
"""

from __future__ import annotations

import numpy as np

PAD_ID = 0
VOCAB_SIZE = 256


def encode(text: str) -> list[int]:
    """Text -> token ids (its UTF-8 bytes)."""
    return list(text.encode("utf-8"))


def encode_tensor(text: str) -> np.ndarray:
    """Text -> int32 array of token ids, without a Python list in between."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def decode(ids: list[int]) -> str:
    """Token ids -> text; out-of-vocabulary ids become U+FFFD, invalid UTF-8 is replaced."""
    raw = bytes(i if 0 <= i < VOCAB_SIZE else 0xFF for i in ids)
    return raw.decode("utf-8", errors="replace")


def tensor_to_bytes(ids: np.ndarray) -> bytes:
    """An int array of byte tokens -> bytes (ids outside 0..255 are clamped to 0xFF)."""
    t = np.asarray(ids, dtype=np.int64)
    return np.where((t >= 0) & (t < VOCAB_SIZE), t, 0xFF).astype(np.uint8).tobytes()
