"""What the tokenize array could not read, judged before the data is declared ready: a run never
goes on having silently lost a file's worth of documents, nor more than a small share of the
corpus (data.max_reject_fraction). Each bad record is in data/rejects/ with its file:line."""

from __future__ import annotations

import itertools
from collections import Counter

from pipeline.config import DataConfig
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.paths import RunPaths
from pipeline.data import sources
from pipeline.data.documents import source_where_key
from pipeline.data.records import TEXT, Document, Reject, Span

# Counted by input file beside the bad records by reason: the records a damaged file is
# predicted to have lost past its one reject, and the damaged streams whose loss cannot be told.
PREDICTED_LOST, UNKNOWN_LOSS = "predicted_lost", "unknown_loss"
NOT_REJECTS = ("documents", "filtered", PREDICTED_LOST, UNKNOWN_LOSS)


def refuse_rejects(data: DataConfig, markers: list[dict], paths: RunPaths) -> list[str]:
    """StageError, in one line naming the file or key, when an input file gave no document but
    had records, when a damaged file lost an unknown number of records, or when the bad and
    lost records are more than data.max_reject_fraction of all (1: any loss accepted).
    Returns a warning line for each damaged file whose loss is accepted."""
    per_file: dict[str, Counter] = {}
    source_of: dict[str, str] = {}
    for marker in markers:
        for source, path, *_ in marker["spans"]:
            source_of[path] = source
        for path, counted in marker.get("inputs", {}).items():  # older markers: totals only
            per_file.setdefault(path, Counter()).update(counted)
    rejects = paths.data_dir / "rejects"
    warnings = []
    for path, counted in sorted(per_file.items()):
        bad = {r: n for r, n in counted.items() if r not in NOT_REJECTS}
        if counted["documents"] == 0 and bad and data.max_reject_fraction < 1:
            key = _text_key(data, source_of.get(path))
            raise StageError(
                f"{_no_document(path, bad, key, 'all')} (each with its line in {rejects})"
            )
        if counted[UNKNOWN_LOSS] and data.max_reject_fraction < 1:
            raise StageError(
                f"data.max_reject_fraction: {path} is damaged ({_most(Counter(bad))}) where how "
                f"many records it lost cannot be told ({counted['documents']:,} documents read "
                f"before; the line is in {rejects}): replace the file, leave it out, or set "
                "data.max_reject_fraction=1 to accept any loss"
            )
        if counted[PREDICTED_LOST] or counted[UNKNOWN_LOSS]:
            lost = (
                f"~{counted[PREDICTED_LOST]:,}"
                if not counted[UNKNOWN_LOSS]
                else "an unknown number of"
            )
            warnings.append(
                f"warning: {path} is damaged ({_most(Counter(bad))}): {lost} records lost after "
                f"the damage, accepted by data.max_reject_fraction={data.max_reject_fraction:g}"
            )
    lost = sum(counted[PREDICTED_LOST] for counted in per_file.values())
    rejected = sum(sum(m["rejected"].values()) for m in markers) + lost
    read_in_all = rejected + sum(_documents_read(m) for m in markers)
    share = rejected / read_in_all if read_in_all else 0.0
    if share > data.max_reject_fraction:
        reasons = sum((Counter(m["rejected"]) for m in markers), Counter())
        reasons[f"{PREDICTED_LOST} after damage"] = lost
        said = "rejected or lost to damaged files" if lost else "rejected"
        raise StageError(
            f"data.max_reject_fraction: {rejected:,} of {read_in_all:,} records ({share:.1%}) "
            f"were {said} ({_most(+reasons)}), more than {data.max_reject_fraction:.1%}; each "
            f"is in {rejects} with its file:line: fix the inputs, or raise "
            "data.max_reject_fraction to accept the loss"
        )
    return warnings


def filtered_out(data: DataConfig, markers: list[dict]) -> list[str]:
    """What each source's row filter left out, a line each (for the verify step's log); a
    StageError naming the filter when it left out every row of a source."""
    lines = []
    reading = sources.by_name(data)
    for name in sorted(reading):
        own = [m["sources"][name] for m in markers if name in m["sources"]]
        filtered = sum(s.get("filtered", 0) for s in own)
        if not filtered:
            continue
        kept = sum(s["documents"] + s["no_token_documents"] for s in own)
        rows = filtered + kept + sum(sum(s["rejected"].values()) for s in own)
        key, where = source_where_key(name), reading[name].where
        if kept == 0:
            raise StageError(
                f"{key}: {where!r} left out all {filtered:,} rows of source {name} that were "
                "read, leaving no document; loosen it, or leave the source out"
            )
        lines.append(f"source {name}: {key} {where!r} left out {filtered:,} of {rows:,} rows")
    return lines


def refuse_unreadable_inputs(data: DataConfig, paths: RunPaths, records: int = 100) -> None:
    """Before anything is submitted: a ConfigError for an input file whose first `records`
    records hold no document (the text under another field, not JSON at all), which the
    tokenize array would otherwise reject whole, hours later. data.max_reject_fraction=1
    accepts any loss, this one too."""
    if data.max_reject_fraction >= 1 or not (data.inputs or data.sources):
        return  # any loss accepted; the built-in corpus
    reading = sources.by_name(data)
    for name, path in sources.files(paths, data):
        if reading[name].format == TEXT:
            continue  # a file is one document, read whole: verify judges these files
        bad: Counter = Counter()
        read = reading[name].read(Span(path, source=name), data.max_document_bytes)
        for item in itertools.islice(read, records):
            if isinstance(item, Document):
                break
            if isinstance(item, Reject):
                bad[item.reason] += 1
        else:
            if bad:
                key = _text_key(data, name)
                why = _no_document(path, dict(bad), key, "the first")
                raise ConfigError(f"{why} (data.max_reject_fraction=1 accepts it)")


def _documents_read(marker: dict) -> int:
    if "inputs" in marker:
        return sum(read.get("documents", 0) for read in marker["inputs"].values())
    return sum(s["documents"] + s["no_token_documents"] for s in marker["sources"].values())


def _text_key(data: DataConfig, source: str | None) -> tuple[str, str]:
    """The key naming the text's field for `source`'s records, and its value."""
    own = data.sources.get(source) if data.sources and source else None
    if own is not None and own.text_key:
        return f"data.sources.{source}.text_key", own.text_key
    return "data.text_key", data.text_key


def _no_document(path: str, bad: dict[str, int], key: tuple[str, str], which: str) -> str:
    """Why `which` records of a file ("all 80", "the first 100") gave no document, naming
    the key that picks the text's field when that is the cause."""
    count = sum(bad.values())
    if set(bad) <= {"missing_text", "blank_line"} and "missing_text" in bad:
        return (
            f"{key[0]}: {which} {count:,} records of {path} have no {key[1]!r} field; set "
            f"{key[0]} to the field its records hold the text in"
        )
    return (
        f"data.inputs: {which} {count:,} records of {path} are bad ({_most(Counter(bad))}), "
        "none a document; fix the file or leave it out"
    )


def _most(reasons: Counter) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in reasons.most_common(3))
