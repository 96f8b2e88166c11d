"""Sentencepiece tokenizer: trained on a seeded sample of the corpus, or an existing model.

Lossless by default (identity normalization, whitespace kept, byte fallback, "\\n" as its own
piece), so decode(encode(text)) == text for every document; the same seed and corpus give the
same model, byte for byte.
"""

from __future__ import annotations

import io
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypedDict

from pipeline.config import PipelineConfig, TokenizerConfig, keys
from pipeline.core import files, provenance
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.data import sources
from pipeline.data.records import Document, Reject, Span
from pipeline.data.sources import corpus_settings


def load(path: str | Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path))


def sample_documents(docs: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of `size` documents in one pass (reservoir sampling)."""
    rng = random.Random(seed)
    sample: list[str] = []
    for i, text in enumerate(docs):
        if i < size:
            sample.append(text)
        else:
            j = rng.randint(0, i)
            if j < size:
                sample[j] = text
    return sample


def _pieces(texts: Iterable[str], max_bytes: int) -> Iterator[str]:
    """Sentencepiece skips any training sentence longer than max_bytes: cut long documents at
    line ends (keeping the newlines) so all of their text is seen."""
    for text in texts:
        if len(text.encode()) <= max_bytes:
            yield text
            continue
        piece: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            n = len(line.encode())
            if piece and size + n > max_bytes:
                yield "".join(piece)
                piece, size = [], 0
            if n > max_bytes:  # one very long line: cut by characters
                step = max(1, max_bytes // 4)
                yield from (line[i : i + step] for i in range(0, len(line), step))
                continue
            piece.append(line)
            size += n
        if piece:
            yield "".join(piece)


def trainer_options(tk: TokenizerConfig) -> dict:
    options = dict(
        model_type=tk.type,
        vocab_size=tk.vocab_size,
        character_coverage=tk.character_coverage,
        byte_fallback=tk.byte_fallback,
        user_defined_symbols=list(tk.user_defined_symbols),
        max_sentence_length=tk.max_sentence_length,
        num_threads=tk.threads,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        train_extremely_large_corpus=False,
        minloglevel=2,
    )
    if tk.lossless:
        options.update(
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
        )
    return options


def train_model(texts: list[str], tk: TokenizerConfig) -> bytes:
    """Train a sentencepiece model on `texts`; returns the serialized model."""
    import sentencepiece as spm

    spm.set_random_generator_seed(tk.seed)
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_pieces(texts, tk.max_sentence_length),
            model_writer=buffer,
            **trainer_options(tk),
        )
    except RuntimeError as e:
        raise StageError(_training_failure(str(e), tk)) from e
    return buffer.getvalue()


def _training_failure(message: str, tk: TokenizerConfig) -> str:
    """sentencepiece's refusal as one line naming the key to change. Its limits depend on the
    corpus (the characters it holds, the pieces it can form), known only once it is read."""
    needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if needed:
        return (
            f"tokenizer.vocab_size: {tk.vocab_size} is smaller than the {needed[2]} characters "
            f"and special pieces this corpus needs at tokenizer.character_coverage="
            f"{tk.character_coverage}; raise tokenizer.vocab_size to at least {needed[2]}, or "
            "lower tokenizer.character_coverage"
        )
    too_high = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", message)
    if too_high:
        return (
            f"tokenizer.vocab_size: {tk.vocab_size} is more pieces than the tokenizer's sample "
            f"of this corpus can form (at most {too_high[2]}); lower tokenizer.vocab_size, or "
            "give more text"
        )
    return f"tokenizer training failed (tokenizer.vocab_size={tk.vocab_size}): {message.strip()}"


def write_vocab(model: Path):
    """Write MODEL.vocab (piece and score per line) beside a model; returns the model loaded."""
    sp = load(model)
    pieces = (f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n" for i in range(sp.vocab_size()))
    files.write_text(model.with_suffix(".vocab"), "".join(pieces))
    return sp


class TokenizerRecord(TypedDict, total=False):
    """tokenizer/tokenizer.json: which model the run uses and how it was made."""

    made_from: dict  # the settings it depends on (pipeline.core.provenance)
    fingerprint: str
    model: str
    vocab_size: int
    eod_id: int
    sha256: str
    trained: bool
    source: str  # the given tokenizer.model, when not trained
    sample_documents: int
    sample_bytes: int
    options: dict
    seconds: float


def settings(paths: RunPaths, cfg: PipelineConfig) -> dict:
    """What the run's tokenizer depends on: the given model's bytes, or the trainer's settings
    and the documents it samples."""
    tk = cfg.tokenizer
    if tk.model:
        return {"tokenizer.model": files.sha256(tk.model)}
    return {
        **keys.settings(tk, "tokenizer", apart=("model",)),
        **corpus_settings(paths, cfg.data),
    }


def provide(cfg: PipelineConfig, made_from: dict) -> TokenizerRecord:
    """The run's tokenizer in tokenizer/: trained on a seeded sample of the corpus, or the
    given tokenizer.model copied in; tokenizer.json (written last) records which."""
    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    target = paths.tokenizer_model
    target.parent.mkdir(parents=True, exist_ok=True)
    tk = cfg.tokenizer
    meta: TokenizerRecord
    if tk.model:
        with files.atomic_path(target) as tmp:
            shutil.copyfile(tk.model, tmp)
        meta = {"source": str(Path(tk.model).resolve()), "trained": False}
    else:
        rejected: Counter = Counter()
        documents = _documents(paths, cfg, rejected)
        sample = sample_documents(documents, tk.sample_documents, tk.seed)
        if not sample:
            raise StageError(_no_document(cfg, rejected))
        model = train_model(sample, tk)
        with files.atomic_path(target) as tmp:
            tmp.write_bytes(model)
        meta = {
            "trained": True,
            "sample_documents": len(sample),
            "sample_bytes": sum(len(t.encode()) for t in sample),
            "options": trainer_options(tk),
        }
    sp = write_vocab(target)
    meta.update(
        made_from=made_from,
        fingerprint=provenance.fingerprint(made_from),
        model=str(target),
        vocab_size=sp.vocab_size(),
        eod_id=sp.eos_id(),
        sha256=files.sha256(target),
        seconds=round(time.time() - started, 2),
    )
    files.write_json(paths.tokenizer_meta, meta)
    return meta


def _documents(paths: RunPaths, cfg: PipelineConfig, rejected: Counter) -> Iterator[str]:
    """Every document of every source, in corpus order; bad records counted by reason."""
    d = cfg.data
    reading = sources.by_name(d)
    for name, path in sources.files(paths, d):
        for item in reading[name].read(Span(path, source=name), d.max_document_bytes):
            if isinstance(item, Document):
                yield item.text
            elif isinstance(item, Reject):
                rejected[item.reason] += 1


def _no_document(cfg: PipelineConfig, rejected: Counter) -> str:
    """Why a corpus gave the tokenizer nothing to train on, naming the key to change."""
    key = "data.sources.<name>.text_key" if cfg.data.sources else "data.text_key"
    field = "the text field" if cfg.data.sources else repr(cfg.data.text_key)
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in rejected.most_common(3))
    if not rejected:
        return "data.inputs: the corpus holds no record (its files are empty)"
    if rejected.most_common(1)[0][0] == "missing_text":
        return (
            f"{key}: no record of the corpus has {field} ({reasons}); set {key} to the field "
            "its records hold the text in"
        )
    if rejected.most_common(1)[0][0] == "text_not_string":
        return (
            f"{key}: {field} of the corpus's records is not a string ({reasons}); the text must "
            "be one string per record"
        )
    return f"data.inputs: the corpus holds no valid document ({reasons}); fix the inputs"
