"""The run's sentencepiece model as a Hugging Face tokenizer folder that gives the same ids.

`AutoTokenizer.from_pretrained(folder)` then encodes every text to `sp.encode(text)` (no BOS, no
EOS: training appends EOS itself) and decodes ids to `sp.decode(ids)`. tokenizer.json is built
with the `tokenizers` library from the model's own pieces and settings, so transformers is not
needed to write it; tokenizer.model beside it keeps the original for sentencepiece readers.

Sentencepiece normalizes the whole text at once (dummy prefix, whitespace) and keeps
user-defined symbols such as "\\n" whole, so the tokenizer does the same: one normalizer over
the whole text, no pre-tokenizer, and user-defined symbols left to the model, where no merge
crosses them. Added tokens would split the text before normalization, and Metaspace skips the
dummy prefix before a leading space, which is why neither carries them.

A model whose behaviour tokenizers cannot reproduce exactly is refused, naming the setting:
unigram models (sentencepiece scores segmentations in float32, tokenizers in float64, so
equal-score ones such as runs of spaces split differently) and normalization rules such as
nmt_nfkc (tokenizers' Precompiled maps a short grapheme cluster by its shortest listed prefix,
sentencepiece by the longest match, so "ﾊﾟ" or decomposed Hangul come out differently).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pipeline.config import TokenizerConfig
from pipeline.core import files
from pipeline.core.errors import StageError

SPACE = "\u2581"  # sentencepiece's whitespace symbol

# sentencepiece_model.proto enums
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5


def write_tokenizer(sp_model: Path, out: Path, model_max_length: int | None = None) -> None:
    """Write tokenizer.model, tokenizer.json, tokenizer_config.json and special_tokens_map.json
    into `out`, each atomically, so a reader never sees a half-written file. Nothing is
    written for a model that cannot be reproduced exactly."""
    data = Path(sp_model).read_bytes()
    proto = _proto(data)
    tokenizer = _tokenizer(proto)
    specials = _special_tokens(proto)
    config = {
        # The generic class loads tokenizer.json as written; LlamaTokenizer rebuilds a BPE with
        # its own pre-tokenizer from the vocabulary and merges, and drops the normalizer.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "add_prefix_space": proto.normalizer_spec.add_dummy_prefix,
        # sentencepiece reads "</s>" in a text as characters, never as the control piece
        "split_special_tokens": True,
        **specials,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    out = Path(out)
    _write(out / "tokenizer.model", data)
    _write(out / "tokenizer.json", tokenizer.to_str(pretty=True).encode())
    _write(out / "tokenizer_config.json", _json(config))
    _write(out / "special_tokens_map.json", _json(specials))


def check_tokenizer(sp_model: Path, out: Path, texts: Iterable[str]) -> None:
    """Refuse an exported tokenizer.json that encodes or decodes one of `texts` differently from
    the sentencepiece model, run as transformers runs it (special tokens read as text)."""
    import sentencepiece as spm
    from tokenizers import Tokenizer

    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    hf = Tokenizer.from_file(str(Path(out) / "tokenizer.json"))
    hf.encode_special_tokens = True
    for n, text in enumerate(texts):
        ids = sp.encode(text)
        if hf.encode(text, add_special_tokens=False).ids != ids:
            how = "encodes"
        elif hf.decode(ids, skip_special_tokens=False) != sp.decode(ids):
            how = "decodes"
        else:
            continue
        raise StageError(
            f"the Hugging Face tokenizer in {out} {how} text {n} ({text[:40]!r}) differently "
            f"from {sp_model}; it cannot be exported exactly"
        )


def _proto(data: bytes):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(data)
    return proto


def _tokenizer(proto):
    """A `tokenizers.Tokenizer` that encodes and decodes as the sentencepiece model does."""
    from tokenizers import AddedToken, Tokenizer, models

    why = _unsupported(proto)
    if why:
        raise StageError(why)
    pieces = proto.pieces
    tokenizer = Tokenizer(
        models.BPE(
            vocab={p.piece: i for i, p in enumerate(pieces)},
            merges=_merges(pieces),
            unk_token=pieces[proto.trainer_spec.unk_id].piece,
            fuse_unk=True,  # sentencepiece joins a run of unknown characters into one
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = _normalizer(proto.normalizer_spec)
    tokenizer.pre_tokenizer = None
    tokenizer.decoder = _decoder(proto.normalizer_spec)
    # special, so that decode(skip_special_tokens=True) drops them
    tokenizer.add_special_tokens(
        [
            AddedToken(p.piece, special=True, normalized=False)
            for p in pieces
            if p.type in (CONTROL, UNKNOWN)
        ]
    )
    return tokenizer


def unsupported(sp_model: Path) -> str | None:
    """Why the sentencepiece model cannot be exported exactly, in one line; None when it can."""
    return _unsupported(_proto(Path(sp_model).read_bytes()))


def unsupported_settings(tk: TokenizerConfig) -> str | None:
    """What in the settings of a tokenizer still to be trained rules out an exact export."""
    for key, value, needed in (
        ("type", tk.type, "bpe"),
        ("lossless", tk.lossless, True),
        ("byte_fallback", tk.byte_fallback, True),
    ):
        if value != needed:
            return f"tokenizer.{key}={value} cannot be, tokenizer.{key}={needed} can"
    return None


def _unsupported(proto) -> str | None:
    """The first setting that tokenizers cannot reproduce exactly."""
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    kind = MODEL_TYPES.get(trainer.model_type, str(trainer.model_type))
    if kind == "unigram":
        return _why(
            "model_type=unigram (tokenizer.type=unigram): tokenizers scores segmentations in "
            "float64, sentencepiece in float32, so equal-score ones (runs of spaces) split "
            "differently; train with tokenizer.type=bpe"
        )
    if kind != "bpe":
        return _why(f"model_type={kind}: only bpe models are exported")
    if norm.precompiled_charsmap:
        return _why(
            f"normalization rule {norm.name!r} (tokenizer.lossless=false): tokenizers' "
            "Precompiled maps some character sequences differently (halfwidth katakana with "
            "sound marks, decomposed Hangul); train with tokenizer.lossless=true"
        )
    if not trainer.byte_fallback:
        return _why(
            "byte_fallback=false (tokenizer.byte_fallback): an unknown piece decodes to ' ⁇ ' "
            "in sentencepiece, to '<unk>' in tokenizers; train with tokenizer.byte_fallback=true"
        )
    if trainer.treat_whitespace_as_suffix or not norm.escape_whitespaces:
        return _why("whitespace as a suffix, or not escaped as '▁', has no tokenizers equivalent")
    if proto.denormalizer_spec.precompiled_charsmap:
        return _why("a denormalization rule has no tokenizers equivalent")
    if any(p.type == UNUSED for p in proto.pieces):
        return _why("pieces of type UNUSED are not reproduced")
    normal = [p.piece for p in proto.pieces if p.type == NORMAL]
    for symbol in (p.piece for p in proto.pieces if p.type == USER_DEFINED):
        # a single character is kept whole by having no merge; a longer symbol would have to
        # split the text before normalization, which moves the dummy prefix
        if len(symbol) != 1 or symbol in (" ", SPACE):
            return _why(
                f"user_defined_symbols {symbol!r}: only single characters other than a space"
            )
        if any(symbol in piece for piece in normal):
            return _why(f"user_defined_symbols {symbol!r} is also inside a normal piece")
    return None


def _why(setting: str) -> str:
    return f"tokenizer: cannot export to Hugging Face format exactly: {setting}"


def _merges(pieces) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, best first. Sentencepiece merges
    the adjacent pair whose union scores highest, so a pair ranks by its union's score, then
    id; the splits of one piece by the parts' ids."""
    ids = {p.piece: i for i, p in enumerate(pieces) if p.type == NORMAL}
    ranked = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-pieces[i].score, i, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _normalizer(norm):
    """Sentencepiece's normalization of the whole text: extra spaces removed (leading, repeated,
    trailing) when asked, the dummy prefix, spaces as "▁"."""
    from tokenizers import Regex, normalizers

    steps = []
    if norm.remove_extra_whitespaces:
        # only " " counts: sentencepiece leaves newlines and tabs alone
        steps += [
            normalizers.Replace(Regex(r"\A +"), ""),
            normalizers.Replace(Regex(r" {2,}"), " "),
        ]
    if norm.add_dummy_prefix:
        steps.append(normalizers.Prepend(SPACE))  # not on an empty text, as sentencepiece
    steps.append(normalizers.Replace(" ", SPACE))
    if norm.remove_extra_whitespaces:
        # sentencepiece drops the trailing "▁" after escaping, so a "▁" of the text counts too
        steps.append(normalizers.Replace(Regex(SPACE + r"+\z"), ""))
    return normalizers.Sequence(steps)


def _decoder(norm):
    """ "▁" back to spaces, byte pieces back to UTF-8, and one space removed from the start of the
    text (Strip acts on each token, so after Fuse) where sentencepiece removes one: with a dummy
    prefix, or where leading spaces were removed from the text anyway."""
    from tokenizers import decoders

    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if norm.add_dummy_prefix or norm.remove_extra_whitespaces:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def _special_tokens(proto) -> dict[str, str]:
    """bos, eos, unk and pad by the model's ids; an id of -1 (pad in ours) has no token."""
    trainer = proto.trainer_spec
    ids = {
        "bos_token": trainer.bos_id,
        "eos_token": trainer.eos_id,
        "unk_token": trainer.unk_id,
        "pad_token": trainer.pad_id,
    }
    return {name: proto.pieces[i].piece for name, i in ids.items() if i >= 0}


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _write(path: Path, data: bytes) -> None:
    with files.atomic_path(path) as tmp:
        tmp.write_bytes(data)
