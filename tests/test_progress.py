"""The one progress bar: counts what it is told, shows a postfix, and does nothing when disabled."""

from __future__ import annotations

from edgecap.workshop._progress import ProgressBar, track


def test_the_bar_counts_updates_from_its_initial_value_and_closes_once():
    bar = ProgressBar(10, "work", initial=3)
    bar.update()
    bar.update(2)
    bar.postfix(loss="0.500")
    task = bar._progress.tasks[0]
    assert (task.completed, task.total, task.fields["postfix"]) == (6, 10, "loss=0.500")
    bar.close()
    bar.close()
    assert bar._progress is None


def test_a_disabled_bar_is_a_no_op():
    with ProgressBar(None, "quiet", enabled=False) as bar:
        bar.update(5)
        bar.postfix(x=1)
        assert bar._progress is None


def test_track_yields_every_item_in_order_with_or_without_a_length():
    assert list(track(range(4), "sized")) == [0, 1, 2, 3]
    assert list(track(iter("abc"), "unsized")) == ["a", "b", "c"]
    assert list(track([1, 2], "quiet", enabled=False)) == [1, 2]
