"""Encoding a long document in pieces whose ids, laid end to end, equal those of the whole text,
so a tokenize task's memory is bounded by the piece, not the document (sentencepiece needs
tens of bytes per byte of text it encodes at once, and a Python list of the ids more).

A cut is made only where no piece of the vocabulary can span it, checked on the vocabulary
itself: after a newline when no piece but "\\n" holds one (the lossless tokenizer makes "\\n" a
piece of its own), else before a space that follows a non-space character when no piece holds
a space after another character (sentencepiece keeps words apart, split_by_whitespace). The
text after a cut is encoded behind the character before it, whose own ids are then dropped, so
that sentencepiece's dummy-prefix space lands on that character, not on the piece. A model that
does not keep whitespace as it is (remove_extra_whitespaces), and a unigram model (see
_is_bpe), are never cut: their documents are encoded whole.
"""

from __future__ import annotations

import re

import numpy as np

PIECE_CHARS = 1 << 20  # characters of text per encode call for a long document
SPACE = "\u2581"  # how sentencepiece writes a space in its pieces
SPACE_AFTER_WORD = re.compile(f"[^ {SPACE}][ {SPACE}]")  # a cut goes between the two


def _is_bpe(sp) -> bool:
    """Whether the model is BPE, whose merges compare the scores of pieces: a unigram model's
    best path adds scores along the text, and where two paths tie, rounding in those sums
    (which differ with what came before) picks one, so it is never cut."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # protobuf absent: no way to tell, so no cut
        return False
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(sp.serialized_model_proto())
    return model.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE


class PieceEncoder:
    """Encodes documents with `sp`: short ones in one call, a long one in pieces."""

    def __init__(self, sp, piece_chars: int | None = None) -> None:
        self.sp, self.piece_chars = sp, piece_chars or PIECE_CHARS
        self.dtype = np.uint16 if sp.vocab_size() < 65500 else np.int32
        pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
        probe = "a  b \t\n  c\n\n d  "
        keeps_spaces = _is_bpe(sp) and sp.decode(sp.encode(probe)) == probe
        known = set(pieces)  # an unknown character could join the unknown one after the cut
        self.at_newline = (
            keeps_spaces and "\n" in known and not any("\n" in p and p != "\n" for p in pieces)
        )
        inside = re.compile(f"[^{SPACE}]{SPACE}")
        self.at_space = (
            keeps_spaces and SPACE in known and not any(inside.search(p) for p in pieces)
        )

    def encode(self, texts: list[str]) -> list:
        """Token ids of each text: a list of ints, or a numpy array for a text cut in pieces."""
        short = [t for t in texts if len(t) <= self.piece_chars]
        ids = iter(self.sp.encode(short, num_threads=1) if short else [])
        return [next(ids) if len(t) <= self.piece_chars else self.encode_long(t) for t in texts]

    def encode_long(self, text: str) -> np.ndarray:
        """The ids of one text, encoded piece by piece between safe cuts."""
        parts: list[np.ndarray] = []
        start = 0
        while start < len(text):
            end = self._cut(text, start)
            if start == 0:
                ids = self.sp.encode(text[:end])
            else:
                before = text[start - 1]
                ids = self.sp.encode(before + text[start:end])[len(self.sp.encode(before)) :]
            parts.append(np.asarray(ids, dtype=self.dtype))
            start = end
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)

    def _cut(self, text: str, start: int) -> int:
        """The end of the piece from `start`: the last safe cut within piece_chars, else the
        first one after (a long stretch with none is encoded whole), else the text's end."""
        limit = start + self.piece_chars
        if limit >= len(text):
            return len(text)
        for window_start, window_end, backwards in (
            (start, limit, True),
            (limit, len(text), False),
        ):
            found = self._safe_cut(text, window_start, window_end, backwards)
            if found is not None:
                return found
        return len(text)

    def _safe_cut(self, text: str, lo: int, hi: int, backwards: bool) -> int | None:
        """A safe cut in (lo, hi]: the last one if `backwards`, else the first."""
        found = []
        if self.at_newline:
            i = text.rfind("\n", lo, hi) if backwards else text.find("\n", lo, hi)
            if i >= 0:
                found.append(i + 1)
        if self.at_space:
            if backwards:  # the last match, looked for near the end first
                for begin in (max(lo, hi - 4096), lo):
                    matches = list(SPACE_AFTER_WORD.finditer(text, begin, hi))
                    if matches:
                        found.append(matches[-1].start() + 1)
                        break
            elif match := SPACE_AFTER_WORD.search(text, lo, hi):
                found.append(match.start() + 1)
        found = [cut for cut in found if cut > lo]
        return (max(found) if backwards else min(found)) if found else None
