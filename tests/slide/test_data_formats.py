"""Data formats: JSON arrays, parquet, arrow and CSV through `datasets`; Alpaca records; a BOM
accepted; non-UTF-8 bytes, directories, chat data and unknown shapes refused in one line."""

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from slide import data_formats
from slide.cli import main
from slide.data import load_token_stream
from slide.errors import DataError

RECORDS = [{"prompt": f"question {i}: what moves?", "completion": f" the weights, {i} times."}
           for i in range(40)]  # fmt: skip


def load(path, tokenizer_dir, tmp_path):
    return load_token_stream(path, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "cache")


def tokens(stream):
    return stream.ids.tolist(), None if stream.predict is None else stream.predict.tolist()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_json_array_is_records_not_text(tmp_path, tokenizer_dir):
    rows = [{"text": "the gpu moves the weights."}, {"text": "the cpu updates them."}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    stream = load(tmp_path / "a.json", tokenizer_dir, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    want = [*tok.encode(rows[0]["text"]), 2, *tok.encode(rows[1]["text"]), 2]
    assert stream.ids.tolist() == want and stream.predict is None


@pytest.mark.parametrize("suffix", [".json", ".parquet", ".arrow"])
def test_hf_formats_equal_the_jsonl(tmp_path, tokenizer_dir, suffix):
    jsonl = load(write_jsonl(tmp_path / "d.jsonl", RECORDS), tokenizer_dir, tmp_path)
    path = tmp_path / f"d{suffix}"
    table = pa.Table.from_pylist(RECORDS)
    if suffix == ".json":
        path.write_text(json.dumps(RECORDS))
    elif suffix == ".parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    assert tokens(load(path, tokenizer_dir, tmp_path)) == tokens(jsonl)


def test_csv_text_column(tmp_path, tokenizer_dir):
    (tmp_path / "d.csv").write_text("text,source\nthe gpu moves,a\nthe cpu updates,b\n")
    jsonl = write_jsonl(
        tmp_path / "d.jsonl", [{"text": "the gpu moves"}, {"text": "the cpu updates"}]
    )
    assert tokens(load(tmp_path / "d.csv", tokenizer_dir, tmp_path)) == tokens(
        load(jsonl, tokenizer_dir, tmp_path)
    )


def test_alpaca_prompt_is_the_template_and_not_trained_on(tmp_path, tokenizer_dir):
    rows = [{"instruction": "Add.", "input": "2 and 3", "output": "5"},
            {"instruction": "Greet.", "input": "", "output": "hello"}]  # fmt: skip
    (tmp_path / "alpaca.json").write_text(json.dumps(rows))
    stream = load(tmp_path / "alpaca.json", tokenizer_dir, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    prompts = [data_formats.ALPACA_INPUT.format(instruction="Add.", input="2 and 3"),
               data_formats.ALPACA.format(instruction="Greet.")]  # fmt: skip
    ids, predict = [], []
    for prompt, row in zip(prompts, rows, strict=True):
        head, body = tok.encode(prompt), tok.encode(row["output"], add_special_tokens=False)
        ids += [*head, *body, 2]
        predict += [False] * len(head) + [True] * (len(body) + 1)
    assert tokens(stream) == (ids, predict)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt"])
def test_a_bom_is_skipped(tmp_path, tokenizer_dir, suffix):
    body = {".jsonl": '{"text": "the gpu"}\n', ".json": '[{"text": "the gpu"}]',
            ".txt": "the gpu moves"}[suffix]  # fmt: skip
    (tmp_path / f"plain{suffix}").write_bytes(body.encode())
    (tmp_path / f"bom{suffix}").write_bytes(data_formats.BOM + body.encode())
    assert tokens(load(tmp_path / f"bom{suffix}", tokenizer_dir, tmp_path)) == tokens(
        load(tmp_path / f"plain{suffix}", tokenizer_dir, tmp_path)
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt"])
def test_non_utf8_names_the_file_and_byte(tmp_path, tokenizer_dir, suffix, monkeypatch):
    monkeypatch.setattr(data_formats, "TEXT_CHUNK", 64)  # the bad byte lies chunks in
    good = "".join(f'{{"text": "é line {i} ü"}}\n' for i in range(20)).encode()
    bad = good + b'{"text": "caf\xe9"}\n'  # Latin-1
    raw = bad if suffix != ".json" else b"[" + bad.replace(b"}\n", b"},")[:-1] + b"]"
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(raw)
    with pytest.raises(DataError) as err:
        load(path, tokenizer_dir, tmp_path)
    at = raw.index(b"\xe9")
    assert f"{path}: byte {at} " in str(err.value)
    assert "is not UTF-8" in str(err.value)
    assert ("(line 21)" in str(err.value)) == (suffix == ".jsonl")
    assert not list((tmp_path / "cache").glob("*/meta.json"))


def test_unknown_columns_are_refused(tmp_path, tokenizer_dir):
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), tmp_path / "qa.parquet")
    with pytest.raises(
        DataError, match=r"qa\.parquet: row 1: expected .* found keys question, answer"
    ):
        load(tmp_path / "qa.parquet", tokenizer_dir, tmp_path)


def test_cli_errors_are_one_line(tmp_path, tokenizer_dir, capsys):
    argv = ["data", "--tokenizer", str(tokenizer_dir), "--data-cache", str(tmp_path / "c"),
            "--no-progress"]  # fmt: skip
    assert main([*argv, "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"data {tmp_path} is a directory" in err and len(err.splitlines()) == 1
    (tmp_path / "x.jsonl").write_bytes(b'{"text": "\xff"}\n')
    assert main([*argv, "--data", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "x.jsonl: byte 10 (line 1) is not UTF-8" in err and len(err.splitlines()) == 1


def test_missing_datasets_library_says_what_to_install(tmp_path, tokenizer_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    (tmp_path / "d.json").write_text(json.dumps(RECORDS))
    with pytest.raises(DataError, match=r"pip install 'slide\[data\]'"):
        load(tmp_path / "d.json", tokenizer_dir, tmp_path)
