"""How many UTF-8 bytes of text each token stands for, as sentencepiece decodes it: the figure
bits per byte divides by, which unlike perplexity does not depend on the tokenizer.

A piece's bytes are its text with "\u2581" read as a space; a byte-fallback piece is one byte; a
control piece (end-of-document) none; the unknown piece its surface. Sentencepiece drops one
leading space from the first piece of a text when the model adds a dummy prefix (or removes
extra whitespace), so the first token of each document counts one byte less where its piece
begins with a space: then the sum over a document's tokens is the length of the text it
decodes to, which for the lossless tokenizer is the document as written.
"""

from __future__ import annotations

import numpy as np

SPACE = "\u2581"


class TokenBytes:
    def __init__(self, sp) -> None:
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(sp.serialized_model_proto())
        norm = proto.normalizer_spec
        strips = norm.add_dummy_prefix or norm.remove_extra_whitespaces
        size = sp.vocab_size()
        self.bytes = np.zeros(size, dtype=np.int64)
        self.first_saves = np.zeros(size, dtype=np.int64)  # dropped from a document's first
        for i in range(size):
            piece = sp.id_to_piece(i)
            if sp.is_control(i):
                continue
            if sp.is_byte(i):
                self.bytes[i] = 1
            elif sp.is_unknown(i):
                self.bytes[i] = len(sp.decode([i]).encode("utf-8"))
            else:
                self.bytes[i] = len(piece.replace(SPACE, " ").encode("utf-8"))
                self.first_saves[i] = int(strips and piece.startswith(SPACE))

    def count(self, tokens: np.ndarray, document_first: np.ndarray) -> int:
        """Bytes of `tokens`; `document_first` marks those that begin a document."""
        tokens = tokens.astype(np.int64)
        return int(self.bytes[tokens].sum() - self.first_saves[tokens[document_first]].sum())
