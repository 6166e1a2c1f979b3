"""The summary's step-time error is said in one line past 10%, with what the re-fit changed."""

from slide.train_report import prediction_warning

BASE = {"tokens_per_s": 9000.0, "predicted_tokens_per_s": 10000.0, "steady_steps": "2-6"}


def test_within_ten_percent_says_nothing():
    assert prediction_warning({**BASE, "step_time_error": 0.099}, refits_profile=True) is None
    assert prediction_warning({**BASE, "step_time_error": None}, refits_profile=True) is None


def test_a_miss_names_its_size_and_the_refit():
    factors = {"gpu": 1.12, "cpu": 1.001, "layer_fwd_floor_s": 1.3}
    summary = {**BASE, "step_time_error": 0.111, "replan": {"factors": factors}}
    line = prediction_warning(summary, refits_profile=True)
    assert line.startswith(
        "the steps ran 11.1% slower than predicted (9,000 tokens/s against 10,000"
    )
    assert "gpu rates / 1.120" in line and "layer_fwd_floor_s floor x 1.300" in line
    assert "cpu" not in line.split(";")[1]  # a factor within 0.5% moved nothing
    assert "kept for this host's next runs of this shape" in line
    kept = prediction_warning(summary, refits_profile=False)
    assert "for this run (--machine auto keeps it for the next)" in kept


def test_a_fast_run_without_a_refit():
    line = prediction_warning({**BASE, "step_time_error": -0.2}, refits_profile=True)
    assert "20.0% faster" in line and "no re-fit ran" in line
