"""CostModel: a handler for every op kind, and each roofline term computed by hand."""

import pytest

from slide_ir.ir.graph import Op, OpKind, Work
from slide_ir.planning.cost import HANDLERS, CostModel, FixedCosts
from slide_ir.planning.host_rates import ADAM_CALL_S, COPY_LATENCY_S, NVME_REQUEST_S
from slide_ir.planning.machine_rates import Efficiency
from slide_ir.specs.hardware import Cpu, Gpu, Link, Machine, Nvme

# Round numbers so every expected duration is exact.
MACHINE = Machine(
    name="round",
    gpu=Gpu(
        name="g",
        memory_bytes=24 << 30,
        bf16_peak_tflops=200.0,
        bf16_matmul_tflops=100.0,
        hbm_bytes_per_s=1e12,
        attention_tflops=50.0,
    ),
    link=Link(
        name="l",
        h2d_bytes_per_s=25e9,
        d2h_bytes_per_s=25e9,
        duplex_bytes_per_s=20e9,
        pageable_h2d_bytes_per_s=10e9,
        pageable_d2h_bytes_per_s=10e9,
    ),
    cpu=Cpu(
        name="c",
        cores=14,  # the update's threads by the one rule: every core but four, 10
        adam_elems_per_s_per_core=1e8,
        cast_elems_per_s_per_core=5e8,
        dram_bytes_per_s=1e11,
        simd="avx2",
    ),
    ram_bytes=128 << 30,
    nvme=(
        Nvme(
            name="d",
            capacity_bytes=2 * 10**12,
            read_bytes_per_s=5e9,
            write_bytes_per_s=4e9,
            gds=False,
        ),
    )
    * 2,
)
NO_LAUNCH = Efficiency(launch_s=0.0)
ATTN = 50e12  # the toy GPU's attention_tflops


def _op(kind, lane="gpu", **work):
    return Op(id="x", kind=kind, lane=lane, step=1, unit=1, work=Work(**work))


def test_every_kind_has_a_handler():
    assert set(HANDLERS) == set(OpKind)


@pytest.mark.parametrize(
    ("op", "seconds"),
    [
        (_op(OpKind.FWD, flops=1e12), 0.01),  # 1e12 / 100 TFLOP/s
        (_op(OpKind.BWD, flops=2e12), 0.02),
        (_op(OpKind.RECOMPUTE, flops=1e12), 0.01),
        (_op(OpKind.LOSS, flops=5e11), 0.005),
        # matmul, attention and elementwise kernels run one after another: their times add
        (
            _op(OpKind.FWD, flops=1e6, bytes=10**9),
            1e-8 + 0.001,
        ),  # 1e6 / 100 TFLOP/s + 1 GB / 1 TB/s
        (_op(OpKind.BWD, flops=2e12, attn_flops=1e12, bytes=10**9), 0.01 + 1e12 / ATTN + 0.001),
        (_op(OpKind.GPU_ADAM, bytes=10**10), 0.01),
        # a copy's latency + bytes at the duplex 20 GB/s
        (_op(OpKind.H2D_PARAM, "h2d", bytes=2 * 10**9), COPY_LATENCY_S + 0.1),
        (_op(OpKind.ACT_LOAD, "h2d", bytes=10**9), COPY_LATENCY_S + 0.05),
        (_op(OpKind.D2H_GRAD, "d2h", bytes=2 * 10**9), COPY_LATENCY_S + 0.1),
        (_op(OpKind.ACT_SAVE, "d2h", bytes=10**9), COPY_LATENCY_S + 0.05),
        # 10 cores x 1e8 = 1e9 elem/s < DRAM 1e11 / 28 B = 3.57e9: compute bound, plus the call
        (_op(OpKind.ADAM, "cpu", elements=10**9, bytes=28 * 10**9), ADAM_CALL_S + 1.0),
        # 100 B/elem: DRAM bound at 1e11 / 100 = 1e9 elem/s... equal; 200 B/elem: 5e8 elem/s
        (_op(OpKind.ADAM, "cpu", elements=10**9, bytes=200 * 10**9), ADAM_CALL_S + 2.0),
        (_op(OpKind.CAST, "cpu", elements=10**9), 1e9 / min(5e9, 1e11 / 6)),
        (_op(OpKind.GRAD_ACCUM, "cpu", elements=10**9, bytes=10 * 10**9), 0.1),
        # one request per op: its latency + bytes at the drive's rate
        (_op(OpKind.NVME_READ, "nvme1", bytes=10**10), NVME_REQUEST_S + 2.0),
        (_op(OpKind.NVME_WRITE, "nvme0", bytes=10**10), NVME_REQUEST_S + 2.5),
    ],
)
def test_roofline_terms(op, seconds):
    assert CostModel(MACHINE, efficiency=NO_LAUNCH).seconds(op) == pytest.approx(seconds)


def test_threads_and_efficiency_scale_rates():
    adam = _op(OpKind.ADAM, "cpu", elements=10**9, bytes=28 * 10**9)
    five = CostModel(MACHINE, cpu_threads=5, efficiency=NO_LAUNCH)
    assert five.seconds(adam) == pytest.approx(ADAM_CALL_S + 2)
    slow = Efficiency(launch_s=1e-3, matmul=0.5)
    assert CostModel(MACHINE, efficiency=slow).seconds(_op(OpKind.FWD, flops=1e12)) == (
        pytest.approx(0.021)
    )


def test_missing_drive_is_named():
    op = _op(OpKind.NVME_READ, "nvme2", bytes=1)
    with pytest.raises(ValueError, match="op x: lane nvme2 needs NVMe drive 2, the machine has 2"):
        CostModel(MACHINE).seconds(op)


def test_bad_efficiency_is_refused():
    with pytest.raises(ValueError, match=r"Efficiency\.link must be > 0"):
        Efficiency(link=0.0)


def test_fixed_costs():
    costs = FixedCosts(seconds_by_id={"x": 3.0}, default=0.5)
    assert costs.seconds(_op(OpKind.FWD)) == 3.0


def test_measured_kernel_rates_and_loaded_dram_replace_the_roofline() -> None:
    """With the calibrated figures: the loss at the LCE rate, the device AdamW at its rate,
    elementwise bytes at the kernels' rate, the host AdamW at the DRAM share left beside DMA."""
    from dataclasses import replace

    gpu = replace(
        MACHINE.gpu, lce_logits_per_s=4e11, elementwise_bytes_per_s=5e11, adam_elems_per_s=2e10
    )
    cpu = replace(MACHINE.cpu, dram_under_dma_bytes_per_s=5.6e10)
    cm = CostModel(replace(MACHINE, gpu=gpu, cpu=cpu), efficiency=Efficiency(launch_s=0.0))
    loss = Op(id="s1.L3.loss", kind=OpKind.LOSS, lane="gpu", step=1, unit=3,
              work=Work(flops=1e12, bytes=1e9, elements=8e9))  # fmt: skip
    assert cm.seconds(loss) == pytest.approx(8e9 / 4e11)
    fwd = Op(id="s1.L1.fwd", kind=OpKind.FWD, lane="gpu", step=1, unit=1,
             work=Work(flops=1e12, bytes=1e9))  # fmt: skip
    assert cm.seconds(fwd) == pytest.approx(1e12 / 100e12 + 1e9 / 5e11)
    gpu_adam = Op(id="s1.L1.gpu_adam", kind=OpKind.GPU_ADAM, lane="gpu", step=1, unit=1,
                  work=Work(bytes=40e8, elements=1e8))  # fmt: skip
    assert cm.seconds(gpu_adam) == pytest.approx(1e8 / 2e10)
    adam = Op(id="s1.L1.adam", kind=OpKind.ADAM, lane="cpu", step=1, unit=1,
              work=Work(bytes=28e8, elements=1e8))  # fmt: skip
    # 10 cores x 1e8 = 1e9/s, capped by 5.6e10 / 28 = 2e9/s: core-bound either way; lower the
    # cores' rate bound above the DMA share to see the share decide
    assert cm.seconds(adam) == pytest.approx(ADAM_CALL_S + 1e8 / 1e9)
    fast = replace(cpu, adam_elems_per_s_per_core=1e9)
    cm = CostModel(replace(MACHINE, gpu=gpu, cpu=fast), efficiency=Efficiency(launch_s=0.0))
    assert cm.seconds(adam) == pytest.approx(ADAM_CALL_S + 1e8 / (5.6e10 / 28))


def test_a_layer_op_takes_at_least_its_dispatch_floor():
    """A layer's forward, recompute and backward (the ops that run attention) and the loss take
    the larger of their rate time and the profile's floor for their kind; other ops, and every
    op on a profile without floors, are priced by the rates alone."""
    from dataclasses import replace

    floors = replace(MACHINE.gpu, layer_fwd_floor_s=1e-3, layer_bwd_floor_s=2e-3, loss_floor_s=3e-3)
    cm = CostModel(replace(MACHINE, gpu=floors), efficiency=Efficiency(launch_s=1e-5))
    small = {"flops": 1e9, "attn_flops": 1e8}  # 9e8 / 100e12 + 1e8 / 50e12 = 11 us
    for kind, floor in ((OpKind.FWD, 1e-3), (OpKind.RECOMPUTE, 1e-3), (OpKind.BWD, 2e-3),
                        (OpKind.LOSS, 3e-3)):  # fmt: skip
        op = _op(kind, **small)
        assert cm.seconds(op) == pytest.approx(1e-5 + floor)
        assert cm.fixed_seconds(op) == pytest.approx(1e-5 + floor - 11e-6)
    big = _op(OpKind.FWD, flops=1e13, attn_flops=1e12)  # 0.09 + 0.02 s: past the floor
    assert cm.seconds(big) == pytest.approx(1e-5 + 0.11)
    assert cm.fixed_seconds(big) == pytest.approx(1e-5)
    embedding = _op(OpKind.FWD, bytes=10**6)  # no attention: not a decoder layer
    assert cm.seconds(embedding) == pytest.approx(1e-5 + 1e6 / 1e12)
    without = CostModel(MACHINE, efficiency=Efficiency(launch_s=1e-5))
    assert without.seconds(_op(OpKind.FWD, **small)) == pytest.approx(1e-5 + 11e-6)
    assert cm.describe()["layer_bwd_floor_s"] == 2e-3
