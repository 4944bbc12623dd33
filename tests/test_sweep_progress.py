"""The sweep's progress bar is tqdm: its label, its total, and ``progress=False`` silencing it."""

import io

from tqdm import tqdm

from mimo_numerics import sweep


def _double(x):
    return 2 * x


def test_progress_bar_is_a_tqdm_with_label_and_total():
    stream = io.StringIO()
    with sweep.progress_bar(4, "cases", stream=stream) as bar:
        assert isinstance(bar, tqdm) and bar.total == 4 and bar.desc == "cases"
        bar.update(3)
        bar.update()
    text = stream.getvalue()
    assert "cases: " in text and "4/4" in text and "100%" in text


def test_disabled_progress_bar_writes_nothing():
    stream = io.StringIO()
    with sweep.progress_bar(4, "cases", enabled=False, stream=stream) as bar:
        bar.update(4)
    assert stream.getvalue() == ""


def test_parallel_map_shows_its_progress_on_stderr(capsys):
    assert sweep.parallel_map(_double, range(5), workers=1, desc="doubling") == [0, 2, 4, 6, 8]
    err = capsys.readouterr().err
    assert "doubling: " in err and "5/5" in err
    assert sweep.parallel_map(_double, range(5), workers=1, progress=False) == [0, 2, 4, 6, 8]
    assert capsys.readouterr().err == ""
