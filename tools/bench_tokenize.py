"""Tokenization benchmark: sentencepiece's own limit, the tokenize stage, Megatron-LM.

Prints measured numbers for one corpus, one sentencepiece model and the same cores:

  (a) raw     sentencepiece batch encode of the already-parsed text (the practical limit)
  (b) stage   `python -m pipeline stages=[tokenize] ...` end to end, JSONL to .bin/.idx,
              process start to exit (start-up, planning, verify included)
  (c) b/a     for the same cores
  (d) megatron-lm  tools/preprocess_data.py on the same input and cores (with --megatron-lm)

and the scaling of the stage from 1 to N tasks. Every run is a subprocess pinned with taskset
to the cores it is allowed; variants run interleaved, `--repeats` times each, medians printed.
Throughput is always JSONL input bytes / wall seconds, so the rows divide into each other.

    python tools/bench_tokenize.py --build-corpus 220 --text-roots /tmp/debs/x/* \\
        --corpus /tmp/bench/corpus.jsonl --megatron-lm /tmp/megatron-lm \\
        --megatron-path /tmp/megatron-deps

docs/benchmarks.md says where the text and the Megatron-LM checkout come from.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import json
import multiprocessing
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6
TINY_MB = 0.5  # the input of the start-up runs

# ---------------------------------------------------------------------------------------------
# Corpus: real text from documentation trees (e.g. Debian doc packages unpacked with dpkg-deb -x)

SKIP_EXTENSIONS = {
    ".png", ".svg", ".gif", ".jpg", ".jpeg", ".ico", ".xpm", ".pbm", ".pdf", ".woff", ".woff2",
    ".ttf", ".css", ".js", ".map", ".inv", ".json", ".yaml", ".yml", ".dts", ".dtsi", ".dot",
    ".elc", ".el", ".py", ".c", ".h", ".sh", ".pl", ".pm", ".sty", ".tex", ".ri", ".sha1",
    ".index", ".qhp", ".devhelp", ".devhelp2", ".hhk", ".hhc",  # help indexes: names, no prose
}  # fmt: skip
MARKUP_EXTENSIONS = {".html", ".htm", ".xhtml", ".page", ".xml", ".xhp"}
MAN_PAGE = re.compile(r"\.\d[a-z]*$")  # roff source: markup, and the pod/texinfo it came from
SINGLE_PAGE = re.compile(r"(^all|singlepage)\.html?$")  # the other pages again, in one file
BLOCK_TAGS = {"p", "div", "br", "li", "tr", "pre", "section", "title", "dd", "dt", "td", "table"}
BLOCK_TAGS |= {f"h{i}" for i in range(1, 7)}
MIN_DOCUMENT_CHARS = 200
MIN_LETTER_SHARE = 0.6  # of non-space characters: keeps prose, drops tables and data files


class _TextOf(html.parser.HTMLParser):
    """The readable text of an HTML/XML page: no scripts or styles, a line break per block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style"):
            self.hidden += 1
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self.hidden:
            self.hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def strip_markup(text: str) -> str:
    parser = _TextOf()
    parser.feed(text)
    parser.close()
    out = re.sub(r"[ \t]+\n", "\n", "".join(parser.parts))
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def document_text(path: str) -> str | None:
    """The text of one documentation file, or None when it is not prose we can read."""
    name, opener = (path[:-3], gzip.open) if path.endswith(".gz") else (path, open)
    ext = os.path.splitext(name)[1].lower()
    if ext in SKIP_EXTENSIONS or MAN_PAGE.search(name):
        return None
    try:
        with opener(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError):
        return None
    if ext in MARKUP_EXTENSIONS:
        text = strip_markup(text)
    if len(text) < MIN_DOCUMENT_CHARS:
        return None
    letters = sum(c.isalpha() for c in text)
    visible = len(text) - sum(c.isspace() for c in text)
    return text if letters >= MIN_LETTER_SHARE * visible else None


def _walk(root: str) -> list[tuple[str, bool]]:
    """(path, inside a Sphinx build) for the regular files under root, in a stable order."""
    found: list[tuple[str, bool]] = []
    sphinx_roots: list[str] = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        if "_sources" in dirs:
            sphinx_roots.append(folder + os.sep)
        in_sphinx = any((folder + os.sep).startswith(r) for r in sphinx_roots)
        for name in sorted(names):
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                found.append((path, in_sphinx))
    return found


def _is_book_rendering(name: str, package: str) -> bool:
    """An info manual or plain-text file of the whole book, named after its package."""
    stem = name.split(".")[0]
    return package.startswith(stem) and (".info" in name or ".txt" in name)


def documentation_files(roots: list[str]) -> Iterator[str]:
    """Files under the roots (one unpacked package each), each text counted once: a Sphinx
    build is read from its _sources (the reStructuredText it was built from), and a package
    with HTML pages is read from them, not from its single-page, info or plain-text copies."""
    for root in roots:
        package = os.path.basename(os.path.normpath(root))
        files = _walk(root)
        has_html = any(path.endswith((".html", ".html.gz")) for path, _ in files)
        for path, in_sphinx in files:
            name = os.path.basename(path)
            duplicate = (
                (in_sphinx and name.endswith(".html"))
                or SINGLE_PAGE.search(name)
                or (has_html and _is_book_rendering(name, package))
            )
            if not duplicate:
                yield path


def build_corpus(roots: list[str], megabytes: float, out: Path, seed: int = 1234) -> dict:
    """Write one JSONL document per readable, distinct documentation file, shuffled (seeded)
    so that byte-range shards hold the same mix, until `megabytes` of JSONL are written.
    Never repeats or invents text: with too little under the roots it writes what there is."""
    seen: set[bytes] = set()
    texts: list[str] = []
    paths = list(documentation_files(roots))
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for text in pool.imap(document_text, paths, chunksize=64):
            if text is None:
                continue
            digest = hashlib.sha1(text.encode()).digest()
            if digest not in seen:
                seen.add(digest)
                texts.append(text)
    random.Random(seed).shuffle(texts)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = documents = 0
    tmp = out.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for text in texts:
            if written >= megabytes * MB:
                break
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode())
            documents += 1
    os.replace(tmp, out)
    return {"files_seen": len(paths), "documents": documents, "bytes": written}


# ---------------------------------------------------------------------------------------------
# Tokenizer: the project's own trainer, on a seeded sample of the corpus


def iter_texts(corpus: Path) -> Iterator[str]:
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train_bpe(corpus: Path, out: Path, vocab_size: int, sample_documents: int) -> Path:
    """A lossless BPE model trained by pipeline.data.tokenizer.train_model, as the step would."""
    from pipeline.config import TokenizerConfig
    from pipeline.data.tokenizer import sample_documents as sample
    from pipeline.data.tokenizer import train_model

    tk = TokenizerConfig(vocab_size=vocab_size, sample_documents=sample_documents, threads=2)
    texts = sample(iter_texts(corpus), tk.sample_documents, tk.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(train_model(texts, tk))
    return out


# ---------------------------------------------------------------------------------------------
# (a) raw sentencepiece: a child process that parses everything first, then times only encode


def encode_only(corpus: Path, model: Path, threads: int, batch_mb: float) -> dict:
    """Seconds sentencepiece's batch encode takes for the whole corpus, text already in memory."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    batches: list[list[str]] = [[]]
    size = 0
    for text in iter_texts(corpus):
        batches[-1].append(text)
        size += len(text)
        if size >= batch_mb * MB:
            batches.append([])
            size = 0
    tokens = 0
    cpu, started = time.process_time(), time.perf_counter()
    for batch in batches:
        tokens += sum(map(len, sp.encode(batch, num_threads=threads)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens}


# ---------------------------------------------------------------------------------------------
# Runs: one subprocess each, pinned to its cores, timed from start to exit


@dataclass
class Variant:
    label: str
    kind: str  # raw | stage | baseline | megatron
    cores: int
    tasks: int = 1
    threads: int = 1


@dataclass
class Run:
    seconds: float
    max_rss_mb: float
    cpu_seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    task_rss_mb: float | None = None  # the largest tokenize task's own peak, as it reports it
    other_cpu: float = 0.0  # CPU seconds other processes of the machine used meanwhile


@dataclass
class Bench:
    corpus: Path
    model: Path
    scratch: Path
    python: str
    megatron_lm: Path | None
    megatron_path: list[str]
    baseline_root: Path | None
    raw_batch_mb: float
    quiet_wait_s: float = 0.0
    commands: dict[str, str] = field(default_factory=dict)


def pinned(cores: int) -> list[str]:
    return ["taskset", "-c", f"0-{cores - 1}"] if shutil.which("taskset") else []


def stage_command(
    b: Bench, v: Variant, corpus: Path, workdir: Path, extra: tuple[str, ...] = ()
) -> list[str]:
    return [
        b.python, "-m", "pipeline", "cluster=local", "stages=[tokenize]", f"workdir={workdir}",
        f"data.inputs=[{corpus}]", f"tokenizer.model={b.model}",
        f"data.num_shards={v.tasks}", f"cluster.cpus_per_task={v.threads}", *extra,
    ]  # fmt: skip


def megatron_command(b: Bench, v: Variant, corpus: Path, workdir: Path) -> list[str]:
    assert b.megatron_lm is not None
    return [
        b.python, str(b.megatron_lm / "tools" / "preprocess_data.py"), "--input", str(corpus),
        "--output-prefix", str(workdir / "megatron"), "--tokenizer-type",
        "GPTSentencePieceTokenizer", "--tokenizer-model", str(b.model), "--append-eod",
        "--workers", str(v.threads),
    ]  # fmt: skip


def raw_command(b: Bench, v: Variant, corpus: Path) -> list[str]:
    return [
        b.python, str(Path(__file__).resolve()), "--encode-only", "--corpus", str(corpus),
        "--model", str(b.model), "--threads", str(v.threads), "--raw-batch-mb",
        str(b.raw_batch_mb),
    ]  # fmt: skip


def command_for(b: Bench, v: Variant, corpus: Path, workdir: Path) -> tuple[list[str], dict, Path]:
    """The command line, its environment and its working folder."""
    env = dict(os.environ)
    if v.kind == "raw":
        return raw_command(b, v, corpus), env, ROOT
    if v.kind == "megatron":
        assert b.megatron_lm is not None
        env["PYTHONPATH"] = os.pathsep.join([str(b.megatron_lm), *b.megatron_path])
        return megatron_command(b, v, corpus, workdir), env, b.megatron_lm
    root = b.baseline_root if v.kind == "baseline" else ROOT
    assert root is not None
    return stage_command(b, v, corpus, workdir), env, root


STEP_DONE = re.compile(r"^\[pipeline\] (\w+): done in ([\d.]+) s", re.M)
TASK_RSS = re.compile(r"^shard \d+: .* max RSS (\d+) MB", re.M)


def busy_seconds() -> float:
    """CPU seconds all cores of the machine have been busy since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(limit_s: float, window_s: float = 2.0, cores: float = 0.2) -> float:
    """On a shared machine: wait (at most limit_s) until the other processes use less than
    `cores` for a whole window, so a run starts on idle cores. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        busy = busy_seconds()
        time.sleep(window_s)
        if busy_seconds() - busy < cores * window_s:
            break
    return time.perf_counter() - started


def run_once(b: Bench, v: Variant, corpus: Path) -> Run:
    """Run one variant in a fresh folder; wall clock from process start to exit."""
    wait_for_quiet(b.quiet_wait_s)
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=b.scratch))
    cmd, env, cwd = command_for(b, v, corpus, workdir)
    cmd = pinned(v.cores) + cmd
    path = f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} " if v.kind == "megatron" else ""
    b.commands.setdefault(v.label, f"(cd {cwd} && {path}{shlex.join(cmd)})")
    log = workdir / "log.txt"
    with open(log, "w") as out:
        busy, started = busy_seconds(), time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds, busy = time.perf_counter() - started, busy_seconds() - busy
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{v.label} failed ({proc.returncode}):\n{text[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    other = max(0.0, busy - cpu)
    if v.kind == "raw":  # the encode phase alone; other CPU stays that of the whole run
        result = json.loads(text.strip().splitlines()[-1])
        seconds, cpu = result["seconds"], result["cpu_seconds"]
    steps = {name: float(s) for name, s in STEP_DONE.findall(text)}
    task_rss = max(map(float, TASK_RSS.findall(text)), default=None)
    shutil.rmtree(workdir)
    return Run(seconds, usage.ru_maxrss / 1024, cpu, steps, task_rss, other)


def variants(threads: list[int], tasks: list[int], megatron: bool, baseline: bool) -> list[Variant]:
    """Every compared run: each kind on 1..N cores, the stage also as N tasks of 1 core."""
    out = [Variant(f"raw sentencepiece, {t} thread(s)", "raw", t, threads=t) for t in threads]
    for kind, name in (("stage", "stage"), ("baseline", "baseline stage")):
        if kind == "baseline" and not baseline:
            continue
        out += [Variant(f"{name}, 1 task x {t} cpu(s)", kind, t, 1, t) for t in threads]
        out += [Variant(f"{name}, {k} tasks x 1 cpu", kind, k, k, 1) for k in tasks if k > 1]
    if megatron:
        out += [Variant(f"megatron-lm, {w} worker(s)", "megatron", w, threads=w) for w in threads]
    return out


def measure(b: Bench, todo: list[Variant], corpus: Path, repeats: int) -> dict[str, list[Run]]:
    """`repeats` rounds; in each, every variant once, the order rotated between rounds so that
    no variant always follows the same neighbour (the machine may be shared)."""
    runs: dict[str, list[Run]] = {v.label: [] for v in todo}
    for r in range(repeats):
        shift = r % len(todo)
        for v in todo[shift:] + todo[:shift]:
            run = run_once(b, v, corpus)
            runs[v.label].append(run)
            with open(b.scratch / "runs.jsonl", "a") as log:  # kept even if this process dies
                log.write(json.dumps({"corpus": str(corpus), "label": v.label, **vars(run)}) + "\n")
            print(
                f"  round {r + 1}: {v.label}: {run.seconds:.2f} s "
                f"(cpu {run.cpu_seconds:.1f} s, other processes {run.other_cpu:.1f} cpu s)",
                file=sys.stderr,
                flush=True,
            )
    return runs


def corpus_slice(corpus: Path, megabytes: float, out: Path) -> Path:
    with open(corpus, "rb") as src, open(out, "wb") as dst:
        for line in src:
            dst.write(line)
            if dst.tell() >= megabytes * MB:
                break
    return out


def identity(b: Bench, corpus: Path) -> list[str]:
    """Our stage (one shard, every document in the training split) and preprocess_data.py on
    the same input: sha256 of each file."""
    workdir = Path(tempfile.mkdtemp(prefix="identity-", dir=b.scratch))
    stage = Variant("identity stage", "stage", 2, 1, 2)
    everything = ("data.split='100,0,0'",)
    subprocess.run(
        stage_command(b, stage, corpus, workdir, everything),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    mega = Variant("identity megatron", "megatron", 2, threads=2)
    cmd, env, cwd = command_for(b, mega, corpus, workdir)
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    lines = []
    for ext in (".bin", ".idx"):
        ours = workdir / "data" / "train" / "corpus" / f"shard-00000{ext}"
        theirs = workdir / f"megatron_text_document{ext}"
        same = ours.read_bytes() == theirs.read_bytes()
        lines.append(
            f"{ext}: {'identical' if same else 'DIFFERENT'} ({ours.stat().st_size} bytes, "
            f"sha256 {sha256_of(ours)[:16]} vs {sha256_of(theirs)[:16]})"
        )
    shutil.rmtree(workdir)
    return lines


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Report


def median(values: list[float]) -> float:
    return statistics.median(values)


def throughput(runs: list[Run], nbytes: int) -> float:
    return nbytes / MB / median([r.seconds for r in runs])


QUIET_CPU_S = 1.0  # a run during which the rest of the machine used less CPU than this


def quiet_throughput(runs: list[Run], nbytes: int) -> float | None:
    """The median over the runs that had the cores to themselves; None when none did."""
    quiet = [r for r in runs if r.other_cpu < QUIET_CPU_S]
    return throughput(quiet, nbytes) if quiet else None


def ratio(a: float | None, b: float | None, digits: int) -> str:
    return f"{a / b:.{digits}f}" if a and b else "-"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*row) for row in rows)


def main_table(todo: list[Variant], runs: dict[str, list[Run]], nbytes: int) -> str:
    rows = [["variant", "cores", "MB/s", "seconds (each run)", "CPU s", "MB/CPU s", "other CPU s"]]
    rows[0] += ["RSS MB", "task RSS MB", "MB/s quiet (runs)"]
    for v in todo:
        rs = runs[v.label]
        rows.append(
            [
                v.label,
                str(v.cores),
                f"{throughput(rs, nbytes):.2f}",
                " ".join(f"{r.seconds:.1f}" for r in rs),
                f"{median([r.cpu_seconds for r in rs]):.1f}",
                f"{nbytes / MB / median([r.cpu_seconds for r in rs]):.2f}",
                " ".join(f"{r.other_cpu:.0f}" for r in rs),
                f"{max(r.max_rss_mb for r in rs):.0f}",
                f"{max(r.task_rss_mb for r in rs):.0f}" if rs[0].task_rss_mb else "-",
                f"{quiet_throughput(rs, nbytes) or 0:.2f} "
                f"({sum(r.other_cpu < QUIET_CPU_S for r in rs)})",
            ]
        )
    return table(rows)


def ratios(todo: list[Variant], runs: dict[str, list[Run]], nbytes: int) -> str:
    """Per core count: stage / raw (b/a) and stage / megatron-lm, both for the same cores;
    from the medians of all runs, and of the quiet runs alone."""
    rows = [["stage variant", "cores", "b/a", "stage / megatron-lm", "b/a quiet", "/ mlm quiet"]]
    for measure_of in (throughput, quiet_throughput):
        mbs = {v.label: measure_of(runs[v.label], nbytes) for v in todo}
        for v in todo:
            if v.kind in ("stage", "baseline"):
                raw = next(
                    (mbs[u.label] for u in todo if u.kind == "raw" and u.cores == v.cores), None
                )
                mlm = next(
                    (mbs[u.label] for u in todo if u.kind == "megatron" and u.cores == v.cores),
                    None,
                )
                cells = [ratio(mbs[v.label], raw, 3), ratio(mbs[v.label], mlm, 2)]
                if measure_of is throughput:
                    rows.append([v.label, str(v.cores), *cells])
                else:
                    next(row for row in rows if row[0] == v.label).extend(cells)
    return table(rows)


def scaling(todo: list[Variant], runs: dict[str, list[Run]], nbytes: int) -> str:
    """Efficiency of N tasks (1 cpu each) against one task on one cpu, and of raw threads."""
    rows = [["variant", "cores", "MB/s", "speed-up", "efficiency", "efficiency quiet"]]
    for kind in ("raw", "stage", "baseline"):
        group = [v for v in todo if v.kind == kind and (kind == "raw" or v.threads == 1)]
        one = next((v for v in group if v.cores == 1), None)
        if one is None:
            continue
        base = throughput(runs[one.label], nbytes)
        quiet_base = quiet_throughput(runs[one.label], nbytes)
        for v in group:
            speedup = throughput(runs[v.label], nbytes) / base
            quiet = quiet_throughput(runs[v.label], nbytes)
            rows.append(
                [
                    v.label,
                    str(v.cores),
                    f"{throughput(runs[v.label], nbytes):.2f}",
                    f"{speedup:.2f}",
                    f"{speedup / v.cores:.2f}",
                    ratio(quiet, quiet_base and quiet_base * v.cores, 2),
                ]
            )
    return table(rows)


def breakdown(todo: list[Variant], runs: dict[str, list[Run]], fixed: dict[str, list[Run]]) -> str:
    """Where a stage run's wall time goes (medians): the pipeline's own step timings."""
    rows = [["variant", "wall s", "before tokenize", "tokenize step", "verify", "tiny input"]]
    for v in todo:
        if v.kind not in ("stage", "baseline", "megatron"):
            continue
        rs = runs[v.label]
        wall = median([r.seconds for r in rs])
        tok = median([r.steps.get("tokenize", 0.0) for r in rs])
        ver = median([r.steps.get("verify", 0.0) for r in rs])
        rest = median([r.seconds - sum(r.steps.values()) for r in rs])
        tiny = fixed.get(v.label)
        rows.append(
            [
                v.label,
                f"{wall:.2f}",
                f"{rest:.2f}" if v.kind != "megatron" else "-",
                f"{tok:.2f}" if v.kind != "megatron" else "-",
                f"{ver:.2f}" if v.kind != "megatron" else "-",
                f"{median([r.seconds for r in tiny]):.2f}" if tiny else "-",
            ]
        )
    return table(rows)


def environment(b: Bench) -> str:
    from importlib.metadata import version

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    lines = [
        f"date: {time.strftime('%Y-%m-%d')}; cpu: {cpu}, {os.cpu_count()} cores",
        f"python {sys.version.split()[0]}, sentencepiece {version('sentencepiece')}, "
        f"megatron-core {version('megatron-core')}, numpy {version('numpy')}",
    ]
    if b.megatron_lm:
        lines.append(f"megatron-lm: {b.megatron_lm} ({megatron_revision(b.megatron_lm)})")
    return "\n".join(lines)


def megatron_revision(path: Path) -> str:
    marker = path / "COMMIT"  # written when the checkout was exported without .git
    if marker.exists():
        return marker.read_text().strip()
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True)
    return done.stdout.decode().strip() or "unknown revision"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="JSONL corpus (text under 'text')")
    p.add_argument("--build-corpus", type=float, metavar="MB", help="write --corpus first")
    p.add_argument("--text-roots", nargs="+", default=[], help="documentation trees to read")
    p.add_argument("--model", type=Path, help="sentencepiece model; default: train one")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--sample-documents", type=int, default=10000, help="to train the model on")
    p.add_argument("--threads", default="1,2", help="cores per run: raw threads, cpus_per_task")
    p.add_argument("--tasks", default="1,2", help="stage scaling: tasks of 1 cpu each")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout")
    p.add_argument("--megatron-path", nargs="*", default=[], help="more PYTHONPATH for it")
    p.add_argument("--baseline-root", type=Path, help="another checkout of this project")
    p.add_argument("--identity-mb", type=float, default=20, help="0: skip the identity check")
    p.add_argument(
        "--raw-batch-mb", type=float, default=16, help="text per raw encode call (M chars)"
    )
    p.add_argument("--quiet-wait", type=float, default=60, help="seconds to wait for idle cores")
    p.add_argument("--scratch", type=Path, help="where runs write (default: a temp folder)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--only", help="run only the variants whose label matches this regex")
    p.add_argument("--encode-only", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def prepare(args: argparse.Namespace) -> Path:
    """The corpus (built when asked) and the model (trained when none is given)."""
    if args.build_corpus:
        info = build_corpus(args.text_roots, args.build_corpus, args.corpus)
        print(f"corpus: {args.corpus}: {info}", file=sys.stderr)
        if info["bytes"] < args.build_corpus * MB:
            print(f"warning: only {info['bytes'] / MB:.0f} MB of text found", file=sys.stderr)
    if args.model:
        return args.model
    model = args.corpus.with_name(f"{args.corpus.stem}.bpe{args.vocab_size}.model")
    if not model.exists():
        train_bpe(args.corpus, model, args.vocab_size, args.sample_documents)
    return model


def report(
    b: Bench,
    todo: list[Variant],
    runs: dict[str, list[Run]],
    fixed: dict[str, list[Run]],
    same: list[str],
) -> None:
    nbytes = b.corpus.stat().st_size
    with open(b.corpus, "rb") as f:
        docs = sum(1 for _ in f)
    print(environment(b))
    print(f"corpus: {b.corpus}, {nbytes / MB:.1f} MB of JSONL, {docs} documents")
    print(f"model: {b.model}")
    print("MB/s: JSONL input MB / median wall seconds (raw: the encode phase alone); CPU s: user")
    print("+ system of the process tree (median); other CPU s: what the rest of the machine used")
    print("during each run (a shared machine); RSS: peak of the largest process; task RSS: the")
    print("peak a tokenize task reports for its own process (in-process: with the launcher)\n")
    print(main_table(todo, runs, nbytes) + "\n")
    print(ratios(todo, runs, nbytes) + "\n")
    print(scaling(todo, runs, nbytes) + "\n")
    print(f"seconds (medians); tiny input: the same command on the first {TINY_MB} MB\n")
    print(breakdown(todo, runs, fixed) + "\n")
    if same:
        print("byte identity with preprocess_data.py, one shard:", *same, sep="\n  ")
    print("\ncommands:")
    for label, cmd in b.commands.items():
        print(f"  {label}:\n    {cmd}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.encode_only:
        print(
            json.dumps(
                encode_only(args.corpus, args.model, ints(args.threads)[0], args.raw_batch_mb)
            )
        )
        return 0
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    scratch.mkdir(parents=True, exist_ok=True)
    b = Bench(
        corpus=args.corpus.resolve(),
        model=prepare(args).resolve(),
        scratch=scratch,
        python=args.python,
        megatron_lm=args.megatron_lm.resolve() if args.megatron_lm else None,
        megatron_path=args.megatron_path,
        baseline_root=args.baseline_root.resolve() if args.baseline_root else None,
        raw_batch_mb=args.raw_batch_mb,
        quiet_wait_s=args.quiet_wait,
    )
    todo = variants(
        ints(args.threads), ints(args.tasks), bool(b.megatron_lm), bool(b.baseline_root)
    )
    todo = [v for v in todo if not args.only or re.search(args.only, v.label)]
    same = []
    if b.megatron_lm and args.identity_mb:
        same = identity(b, corpus_slice(b.corpus, args.identity_mb, scratch / "slice.jsonl"))
    runs = measure(b, todo, b.corpus, args.repeats)
    # nearly all fixed cost
    tiny = corpus_slice(b.corpus, TINY_MB, scratch / "tiny.jsonl")
    fixed_todo = [v for v in todo if v.kind != "raw"]
    saved = dict(b.commands)
    fixed = measure(b, fixed_todo, tiny, args.repeats)
    b.commands = saved
    report(b, todo, runs, fixed, same)
    return 0


if __name__ == "__main__":
    sys.exit(main())
