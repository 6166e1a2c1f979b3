"""A chat SFT data set from the bundled corpus, for a real `slide train` on chat data.

Each paragraph of `slide/assets/corpus.txt` becomes one conversation: the user gives its
first sentence and asks for the rest, the assistant answers with the rest of the paragraph
(so the loss is on the assistant's sentences). Every tenth conversation goes to the eval file.
The tokenizer is the bundled tiny BPE (`slide.tokenizer.build_tiny_tokenizer`) with three role
tokens and a chat template added, saved as an HF tokenizer directory.

    python -m bench.chat.make_sft OUT_DIR    # writes OUT_DIR/{tokenizer/, train.jsonl, eval.jsonl}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slide.tokenizer import CORPUS, build_tiny_tokenizer

ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|end|>"]
TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{{ m['content'] }}{{ '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
EVAL_EVERY = 10  # every tenth conversation is held out


def conversations(corpus: Path = CORPUS) -> list[list[dict[str, str]]]:
    out = []
    for paragraph in corpus.read_text().split("\n\n"):
        sentences = [s.strip() for s in paragraph.replace("\n", " ").split(". ") if s.strip()]
        if len(sentences) < 2:
            continue
        first, rest = sentences[0], ". ".join(sentences[1:])
        out.append([
            {"role": "user", "content": f"Continue the text: {first}."},
            {"role": "assistant", "content": rest if rest.endswith(".") else rest + "."},
        ])  # fmt: skip
    return out


def chat_tokenizer(out: Path) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tiny_tokenizer(out / "tiny-bpe")))
    tok.add_special_tokens({"additional_special_tokens": ROLE_TOKENS})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(out / "tokenizer"))
    return out / "tokenizer"


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chat_tokenizer(out)
    chats = conversations()
    files = {"train": [], "eval": []}
    for i, chat in enumerate(chats):
        files["eval" if i % EVAL_EVERY == EVAL_EVERY - 1 else "train"].append(chat)
    for name, rows in files.items():
        (out / f"{name}.jsonl").write_text(
            "".join(json.dumps({"messages": c}) + "\n" for c in rows)
        )
        print(f"{name}: {len(rows)} conversations")


if __name__ == "__main__":
    main(sys.argv[1])
