"""A small byte-level BPE tokenizer trained on the bundled corpus, saved as a HF tokenizer dir.

Demos and tests need a real local tokenizer and no downloads: this builds one in well under a
second. Its vocabulary (512) matches the built-in `tiny-llama`; ids 0-2 are <pad>, <s>, </s>.
"""

from __future__ import annotations

from pathlib import Path

from slide.data import CORPUS

TINY_VOCAB = 512
SPECIALS = ["<pad>", "<s>", "</s>"]


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
