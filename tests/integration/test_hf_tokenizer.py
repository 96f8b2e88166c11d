"""The exported Hugging Face tokenizer, loaded by transformers, gives sentencepiece's ids and
text back for hostile texts and a whole corpus; models it cannot reproduce are refused."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import sentencepiece as spm
from transformers import AutoTokenizer

from pipeline.config import TokenizerConfig
from pipeline.core.errors import StageError
from pipeline.data.tokenizer import train_model, trainer_options
from pipeline.model.huggingface.tokenizer import check_tokenizer, write_tokenizer
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

CODE = '''def {name}({a}, {b}=None):
    """{sentence}."""
    if {a} is None:
        return {n}
\tfor i in range({n}):  # {word}
        {b} = {a} * i   +  {n}
    return {{"{word}": {b}, "list": [{n}, {n2}]}}
'''

HOSTILE = [
    "",
    " ",
    "   ",
    " leading",
    "trailing ",
    "  two  spaces",
    "\ttab",
    "a\nb",
    "\n\nline",
    "x\n y",
    "12345",
    "naïve café",
    "日本語のテキスト",
    "emoji 🙂 here",
    "mixed\tTAB\n and  spaces ",
    "\nstarts with a newline",
    "ends with a newline\n",
    "windows\r\nline ends\r\n",
    "<s> and </s> or <unk> and <0x41> as text",
    "▁already▁escaped ▁",
    "rare ᚠᛇᚻ runes, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and a nul\x00",
    CODE.format(
        name="hostile", a="x", b="y", sentence="A long\tcode snippet", n=1234, n2=56, word="ok"
    )
    * 3,
]


def _corpus(documents: int = 300, seed: int = 0) -> list[str]:
    """Varied text: prose, code with indentation, digits, accented, CJK and emoji characters
    (the rarest fall back to bytes)."""
    rng = random.Random(seed)
    syllables = ["ka", "ri", "to", "mo", "na", "shi", "ve", "lo", "pra", "ent", "ion", "ing"]
    syllables += ["the", "and", "qu", "ex", "al", "er", "str"]
    extras = [
        "naïve café résumé",
        "Ångström über straße",
        "日本語のテキスト",
        "中文文本测试",
        "한국어 문장",
        "Привет мир",
        "Ωμέγα",
        "🙂",
        "🚀👍🏽",
        "∑∫≈",
        "\u00a0",
    ]

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))

    def prose() -> str:
        parts = []
        for _ in range(rng.randint(30, 200)):
            r = rng.random()
            if r < 0.75:
                parts.append(word())
            elif r < 0.83:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
            elif r < 0.9:
                parts.append(rng.choice(extras))
            else:
                parts.append(rng.choice(["\n", "\n\n", "  ", "\t", ",", ".", "   "]))
        return " ".join(parts)

    def code() -> str:
        return "\n".join(
            CODE.format(
                name=word(),
                a=word(),
                b=word(),
                sentence=prose()[:60],
                n=rng.randint(0, 999),
                n2=rng.randint(0, 99999),
                word=word(),
            )
            for _ in range(rng.randint(1, 5))
        )

    return [code() if rng.random() < 0.3 else prose() for _ in range(documents)]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _corpus()


def _model(tmp_path_factory, corpus, name: str, **overrides) -> tuple:
    """A sentencepiece model trained on the corpus, exported to a folder of its own."""
    folder = tmp_path_factory.mktemp(name)
    model = folder / "tokenizer.source.model"
    model.write_bytes(train_model(corpus, TokenizerConfig(vocab_size=1000, **overrides)))
    out = folder / "hf"
    out.mkdir()
    write_tokenizer(model, out)
    return spm.SentencePieceProcessor(model_file=str(model)), model, out


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, corpus):
    return _model(tmp_path_factory, corpus, "bpe")


@pytest.fixture(scope="module")
def bpe_trimmed(tmp_path_factory, corpus):
    """Lossless otherwise, but no dummy prefix and extra spaces removed, as a tokenizer.model
    brought from elsewhere may be."""
    folder = tmp_path_factory.mktemp("trimmed")
    model = folder / "trimmed.model"
    options = trainer_options(TokenizerConfig(vocab_size=1000))
    options.update(add_dummy_prefix=False, remove_extra_whitespaces=True)
    with model.open("wb") as f:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=f, **options)
    out = folder / "hf"
    out.mkdir()
    write_tokenizer(model, out)
    return spm.SentencePieceProcessor(model_file=str(model)), model, out


def _assert_same(sp, tokenizer, texts: list[str]) -> None:
    for text in texts:
        ids = sp.encode(text)
        assert tokenizer(text, add_special_tokens=True)["input_ids"] == ids, repr(text)
        assert tokenizer.decode(ids) == sp.decode(ids), repr(text)


@pytest.mark.parametrize("which", ["bpe", "bpe_trimmed"])
def test_hostile_texts_give_sentencepiece_ids_and_text(which, request):
    sp, _, out = request.getfixturevalue(which)
    tokenizer = AutoTokenizer.from_pretrained(out)
    _assert_same(sp, tokenizer, HOSTILE)
    assert tokenizer.bos_token_id == sp.bos_id() == 1
    assert tokenizer.eos_token_id == sp.eos_id() == 2
    assert tokenizer.unk_token_id == sp.unk_id() == 0
    assert tokenizer.pad_token is None
    assert len(tokenizer) == sp.vocab_size()
    # training appends EOS after each document; decoding can skip it again
    ids = sp.encode(HOSTILE[-1]) + [sp.eos_id()]
    assert tokenizer.decode(ids, skip_special_tokens=True) == sp.decode(ids)
    assert tokenizer.convert_ids_to_tokens(ids) == [sp.id_to_piece(i) for i in ids]


@pytest.mark.parametrize("which", ["bpe", "bpe_trimmed"])
def test_every_training_document_gives_the_same_pieces(which, request, corpus):
    sp, model, out = request.getfixturevalue(which)
    tokenizer = AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(corpus, add_special_tokens=True)["input_ids"]
    for text, ids in zip(corpus, encoded, strict=True):
        assert ids == sp.encode(text), repr(text[:80])
    assert tokenizer.batch_decode(encoded) == [sp.decode(ids) for ids in encoded]
    check_tokenizer(model, out, corpus + HOSTILE)


def test_folder_holds_the_model_and_a_config_without_bos(bpe):
    sp, model, out = bpe
    assert (out / "tokenizer.model").read_bytes() == model.read_bytes()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["add_bos_token"] is False and config["add_eos_token"] is False
    assert config["add_prefix_space"] is True and config["clean_up_tokenization_spaces"] is False
    assert "model_max_length" not in config
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    assert json.loads((out / "special_tokens_map.json").read_text()) == specials
    assert sorted(p.name for p in out.iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    ]


def test_writing_does_not_need_transformers(bpe, tmp_path):
    _, model, _ = bpe
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from pipeline.model.huggingface.tokenizer import write_tokenizer\n"
        f"write_tokenizer(Path({str(model)!r}), Path({str(tmp_path)!r}), 2048)\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 2048


def test_a_tokenizer_that_differs_is_found(bpe, corpus, tmp_path):
    _, model, out = bpe
    spec = json.loads((out / "tokenizer.json").read_text())
    spec["normalizer"]["normalizers"] = spec["normalizer"]["normalizers"][1:]  # no dummy prefix
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(StageError, match="encodes text 0"):
        check_tokenizer(model, tmp_path, corpus)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"type": "unigram"}, "tokenizer.type=unigram"),
        ({"lossless": False}, "tokenizer.lossless=false"),
        ({"byte_fallback": False}, "tokenizer.byte_fallback"),
        ({"user_defined_symbols": ["\n", "<tab>"]}, "user_defined_symbols '<tab>'"),
    ],
)
def test_models_that_cannot_be_reproduced_are_refused(overrides, setting, corpus, tmp_path):
    model = tmp_path / "tokenizer.model"
    model.write_bytes(train_model(corpus, TokenizerConfig(vocab_size=1000, **overrides)))
    out = tmp_path / "hf"
    out.mkdir()
    with pytest.raises(StageError, match=setting) as refused:
        write_tokenizer(model, out)
    assert "\n" not in str(refused.value)
    assert list(out.iterdir()) == []
