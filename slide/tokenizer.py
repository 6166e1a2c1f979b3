"""Tokenizers: loading a local HF tokenizer directory, the files that make one up (hashed to key
the token cache, copied into checkpoints), and a small byte-level BPE trained on the bundled
corpus.

Demos and tests need a real local tokenizer and no downloads: `build_tiny_tokenizer` builds one
in well under a second. Its vocabulary (512) matches the built-in `tiny-llama`; ids 0-2 are
<pad>, <s>, </s>; it adds no BOS, and EOS (</s>) is what separates documents.
"""

from __future__ import annotations

from pathlib import Path

from slide.errors import DataError

CORPUS = Path(__file__).parent / "assets" / "corpus.txt"
TINY_VOCAB = 512
SPECIALS = ["<pad>", "<s>", "</s>"]
# what AutoTokenizer.from_pretrained reads, across tokenizer kinds (fast, BPE, WordPiece,
# SentencePiece); a model directory's config.json and weights are not among them
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The tokenizer files `directory` holds, in TOKENIZER_FILES order (none: not a tokenizer)."""
    return [Path(directory) / n for n in TOKENIZER_FILES if (Path(directory) / n).is_file()]


def load_tokenizer(tokenizer_dir: str | Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    if not Path(tokenizer_dir).is_dir():
        raise DataError(f"tokenizer directory {tokenizer_dir} does not exist")
    if not tokenizer_files(tokenizer_dir):
        raise DataError(
            f"tokenizer directory {tokenizer_dir} holds no tokenizer files (tokenizer.json, "
            "tokenizer.model, vocab.json, ...)"
        )
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def build_tiny_tokenizer(
    out_dir: str | Path, *, corpus: Path = CORPUS, vocab_size: int = TINY_VOCAB
) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    if (out / "tokenizer.json").is_file():
        return out
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(out))
    return out
