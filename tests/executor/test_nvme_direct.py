"""The NVMe files without the page cache: O_DIRECT alignment, short transfers, a full
disk, nothing left behind, the buffered fallback, and runs that equal the RAM run bit for bit
with none of their state in the page cache."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
from pathlib import Path

import pytest
import torch
from hf_models import spec_of
from runs import assert_bitwise_equal, build_run, model_config, run_executor

from executor import nvme_io
from executor.nvme import NvmeStore
from executor.nvme_io import ALIGN, NvmeSpaceError, aligned_empty
from slide_ir import TrainConfig, load_machine
from slide_ir.planning.planner import plan

# Optimizer state and layer inputs on two drives, every unit sliding (nothing kept on the
# "GPU"), so every stripe and input really goes through the files.
ON_NVME = {"drives": 2, "resident": 0, "streamed": 0, "steps": 3}
# Region sizes that are not multiples of ALIGN: every region has a partial last block.
SIZES = {0: 5000, 1: 3 * ALIGN + 1, 2: 10, 3: 2 * ALIGN}


def _store(directory: Path, **kw: object) -> NvmeStore:
    return NvmeStore(directory, 2, SIZES, act_slots={0: {0, 2}, 1: {1}}, act_bytes=6000, **kw)  # type: ignore[arg-type]


def _bytes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).to(
        torch.uint8
    )


def _round_trip(store: NvmeStore, misaligned: bool = False) -> None:
    """Write every region of both drives, then read each back into a fresh buffer."""
    regions = [(u, store.offset[u], n) for u, n in SIZES.items()]
    regions += [(f"act{j}", store.act_offset(j, 6000), 6000) for j in (0, 1, 2)]
    written = {}
    for drive in (0, 1):
        for i, (name, offset, n) in enumerate(regions):
            src = _bytes(n, seed=100 * drive + i)
            buf = (
                aligned_empty(n + 1, torch.uint8)[1:]
                if misaligned
                else aligned_empty(n, torch.uint8)
            )
            buf.copy_(src)
            store.write(drive, offset, buf)
            written[drive, name] = src
    for drive in (0, 1):
        for name, offset, n in regions:
            back = aligned_empty(n, torch.uint8)
            store.read(drive, offset, back)
            assert torch.equal(back, written[drive, name]), (drive, name)


# -- the page cache, as mincore(2) sees it -------------------------------------------------------
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int64,
]
_libc.mmap.restype = ctypes.c_void_p
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def cached_pages(path: Path) -> int:
    """Pages of `path` in the page cache now (mapping a file does not read it)."""
    size = path.stat().st_size
    if not size:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in vec)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


@pytest.fixture
def mincore_tells(tmp_path: Path) -> None:
    """Skip unless mincore sees pages a plain buffered write leaves in the cache."""
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(16 * ALIGN))
    try:
        seen = cached_pages(probe)
    except OSError as exc:
        pytest.skip(f"mincore does not work here: {exc}")
    finally:
        probe.unlink()
    if not seen:
        pytest.skip("mincore reports no cached pages even for a buffered write: cannot tell")


def _o_direct_works(directory: Path) -> bool:
    path = directory / ".probe"
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | nvme_io.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    if not _o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT (the fallback is tested below)")
    return tmp_path


def _refuse_o_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def no_direct(path, flags, *args, **kw):  # type: ignore[no-untyped-def]
        if flags & nvme_io.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", no_direct)


# -- alignment ----------------------------------------------------------------------------------
def test_aligned_buffers_and_regions(direct_dir: Path) -> None:
    for numel, dtype in [
        (1, torch.uint8),
        (1000, torch.float32),
        (3, torch.bfloat16),
        (0, torch.uint8),
    ]:
        t = aligned_empty(numel, dtype)
        assert t.data_ptr() % ALIGN == 0 and t.numel() == numel and t.dtype == dtype
    store = _store(direct_dir)
    try:
        assert store.direct
        assert all(o % ALIGN == 0 for o in store.offset.values())
        assert all(store.act_offset(j, 6000) % ALIGN == 0 for j in range(3))
        # regions never overlap: each starts at or after the padded end of the one before
        assert store.offset[1] >= store.offset[0] + SIZES[0] and store.act_stride >= 6000
        _round_trip(store)
    finally:
        store.close()
    assert not list(direct_dir.iterdir())


def test_a_runs_staging_buffers_are_aligned(tmp_path: Path) -> None:
    cfg = model_config(False)
    config = TrainConfig(
        batch=2,
        seq=16,
        steps=1,
        optimizer="nvme",
        activations="nvme",
        **{k: ON_NVME[k] for k in ("resident", "streamed")},
    )
    p = plan(spec_of(cfg), load_machine("h200-16c-128g", nvme=2), config)
    run = build_run(p, cfg, tmp_path, torch.float32)
    try:
        staging = {
            k: t
            for k, t in run.env.buffers.items.items()
            if k.startswith(("opt_staging_", "pinned_act_staging"))
        }
        assert any(k.startswith("opt_staging_") for k in staging)
        assert any(k.startswith("pinned_act_staging") for k in staging)
        assert all(t.data_ptr() % ALIGN == 0 for t in staging.values()), staging.keys()
    finally:
        run.close()
    assert not list(tmp_path.iterdir())


def test_a_misaligned_buffer_still_works_through_the_bounce_block(
    direct_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(direct_dir)
    try:
        with caplog.at_level(logging.WARNING, "executor.nvme"):
            _round_trip(store, misaligned=True)
    finally:
        store.close()
    assert sum("not 4096-aligned" in r.message for r in caplog.records) == 2  # once per file


# -- short transfers ----------------------------------------------------------------------------
def _short(real, calls: list[int]):  # type: ignore[no-untyped-def]
    """A pread/pwrite that does only the first aligned half of a long transfer and then claims
    100 bytes fewer than it did, so the next call starts in the middle of a block."""

    def call(fd, buf, offset):  # type: ignore[no-untyped-def]
        view = buf[0] if isinstance(buf, list) else buf
        if len(view) <= ALIGN:
            return real(fd, buf, offset)
        calls.append(len(view))
        part = view[: max(ALIGN, len(view) // 2 // ALIGN * ALIGN)]
        got = real(fd, [part] if isinstance(buf, list) else part, offset)
        return got - 100

    return call


@pytest.mark.parametrize("refused", [False, True], ids=["o-direct", "buffered-fallback"])
def test_short_reads_and_writes_are_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    if refused:
        _refuse_o_direct(monkeypatch)
    elif not _o_direct_works(tmp_path):
        pytest.skip("O_DIRECT refused here")
    store = _store(tmp_path)
    calls: list[int] = []
    monkeypatch.setattr(os, "pwrite", _short(os.pwrite, calls))
    monkeypatch.setattr(os, "preadv", _short(os.preadv, calls))
    try:
        assert store.direct is not refused
        _round_trip(store)
    finally:
        store.close()
    assert len(calls) > 10  # the short path really ran


def test_a_read_past_the_end_is_an_error_not_a_loop(direct_dir: Path) -> None:
    store = _store(direct_dir)
    try:
        with pytest.raises(OSError, match="read nothing"):
            store.read(0, 1 << 30, aligned_empty(ALIGN, torch.uint8))
    finally:
        store.close()


# -- a full disk, files left behind -------------------------------------------------------------
def test_too_little_free_space_is_refused_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs

    def nearly_full(path):  # type: ignore[no-untyped-def]
        st = real(path)
        return os.statvfs_result((*st[:4], 2, *st[5:]))  # f_bavail: two blocks

    monkeypatch.setattr(os, "statvfs", nearly_full)
    with pytest.raises(NvmeSpaceError) as err:
        _store(tmp_path)
    message = str(err.value)
    assert str(tmp_path) in message and "bytes" in message
    assert f"need {_need()} bytes" in message, message
    assert not list(tmp_path.iterdir())


def _need() -> int:
    """Both drives' files: all stripes each, and three activation slots between them."""
    return 2 * sum(nvme_io.align_up(n) for n in SIZES.values()) + 3 * nvme_io.align_up(6000)


def test_no_space_to_reserve_is_a_clear_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fallocate(fd, mode, offset, nbytes):  # type: ignore[no-untyped-def]
        calls.append(fd)
        if len(calls) < 3:
            return 0
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(nvme_io, "_fallocate", fallocate)
    with pytest.raises(NvmeSpaceError, match=f"--nvme-dir {tmp_path}: no space left to reserve"):
        _store(tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_write_that_hits_a_full_disk_names_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)

    def enospc(*args):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", enospc)
    with pytest.raises(
        NvmeSpaceError, match=f"--nvme-dir {tmp_path}: no space left writing 5000 bytes"
    ):
        store.write(0, store.offset[0], aligned_empty(5000, torch.uint8))
    store.close()
    assert not list(tmp_path.iterdir())


def test_a_run_on_a_full_disk_fails_clearly_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the k-th write: during the initial load (k=1) and from a lane (k=40)."""
    real = os.pwrite
    for fail_at in (1, 40):
        count = [0]

        def full(fd, buf, offset, fail_at=fail_at, count=count):  # type: ignore[no-untyped-def]
            count[0] += 1
            if count[0] >= fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, buf, offset)

        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(NvmeSpaceError, match="no space left writing") as err:
            run_executor(False, optimizer="nvme", train_kwargs={"nvme_dir": tmp_path}, **ON_NVME)
        assert count[0] >= fail_at
        # the initial load makes 22 writes here: the 40th is an nvme lane's
        in_lane = any("on nvme" in note for note in getattr(err.value, "__notes__", []))
        assert in_lane == (fail_at == 40)
        assert not list(tmp_path.iterdir())


def test_an_existing_file_is_never_overwritten_or_removed(tmp_path: Path) -> None:
    (tmp_path / "nvme1.bin").write_bytes(b"not ours")
    with pytest.raises(FileExistsError, match=r"nvme1\.bin exists"):
        _store(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["nvme1.bin"]  # ours (nvme0.bin) removed
    assert (tmp_path / "nvme1.bin").read_bytes() == b"not ours"


# -- the fallback -------------------------------------------------------------------------------
def test_where_o_direct_is_refused_one_warning_and_no_cached_pages(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mincore_tells: None,
) -> None:
    _refuse_o_direct(monkeypatch)
    with caplog.at_level(logging.WARNING, "executor.nvme"):
        store = _store(tmp_path)
    try:
        warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
        assert (
            len(warnings) == 1
            and str(tmp_path) in warnings[0]
            and "O_DIRECT refused" in warnings[0]
        )
        assert not store.direct
        _round_trip(store)
        assert [cached_pages(p) for p in store.paths] == [0, 0]
    finally:
        store.close()
    assert not list(tmp_path.iterdir())


# -- whole runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "where",
    [{"optimizer": "nvme"}, {"optimizer": "nvme-moments"}, {"activations": "nvme"}],
    ids=["optimizer", "moments", "activations"],
)
def test_a_run_on_nvme_equals_the_ram_run_bit_for_bit(tmp_path: Path, where: dict) -> None:
    ram = run_executor(False, activations="cpu", **ON_NVME)
    disk = run_executor(
        False, **{"activations": "cpu", **where}, train_kwargs={"nvme_dir": tmp_path}, **ON_NVME
    )
    assert_bitwise_equal(disk, ram)
    assert not list(tmp_path.iterdir())  # the files are removed when the run ends


def test_after_each_step_the_page_cache_holds_none_of_the_state(
    direct_dir: Path, mincore_tells: None
) -> None:
    seen: list[tuple[int, int]] = []  # (file bytes, cached pages) of each file after each step

    def look(step, loss, lr, metrics):  # type: ignore[no-untyped-def]
        seen.extend(
            (p.stat().st_size, cached_pages(p)) for p in sorted(direct_dir.glob("nvme*.bin"))
        )

    run_executor(
        False,
        optimizer="nvme",
        activations="nvme",
        train_kwargs={"nvme_dir": direct_dir, "on_step": look},
        **ON_NVME,
    )
    assert len(seen) == 2 * ON_NVME["steps"] and all(size > 0 for size, _ in seen)
    assert [pages for _, pages in seen] == [0] * len(seen)
