"""History: reads commit in runs of K, verdicts commit the accepted prefix; bounded observations."""

from __future__ import annotations

from typing import Any

from mcp_spec_proxy.trajectory import OBSERVATION_LIMIT, History, Segment, Step, observation_text


def read(n: int) -> Step:
    return Step(f"fs__read_{n}", {"n": n}, "read")


def write(name: str = "fs__write") -> Step:
    return Step(name, {"path": "a.txt"}, "write", intent="save the notes")


def history_with_reads(count: int, commit_every: int = 8) -> History:
    history = History(commit_every=commit_every)
    for n in range(count):
        history.record_read(read(n))
    return history


# -- record_read -----------------------------------------------------------------------------


def test_reads_stay_open_below_the_commit_threshold() -> None:
    history = history_with_reads(3, commit_every=4)

    assert [s.tool for s in history.open] == ["fs__read_0", "fs__read_1", "fs__read_2"]
    assert list(history.committed) == []


def test_kth_read_commits_the_run_without_review() -> None:
    history = history_with_reads(4, commit_every=4)

    assert [s.tool for s in history.committed] == ["fs__read_0", "fs__read_1", "fs__read_2", "fs__read_3"]
    assert history.open == ()


def test_reads_after_a_commit_start_a_new_open_run() -> None:
    history = history_with_reads(6, commit_every=4)

    assert [s.tool for s in history.committed] == ["fs__read_0", "fs__read_1", "fs__read_2", "fs__read_3"]
    assert [s.tool for s in history.open] == ["fs__read_4", "fs__read_5"]


def test_commit_every_one_commits_each_read() -> None:
    history = history_with_reads(2, commit_every=1)

    assert len(history.committed) == 2
    assert history.open == ()


# -- segments --------------------------------------------------------------------------------


def test_segment_is_the_open_reads_then_the_held_call() -> None:
    history = history_with_reads(2)
    held = write()

    segment = history.segment(held)

    assert len(segment) == 3
    assert segment.held is held
    assert [s.tool for s in segment.steps] == ["fs__read_0", "fs__read_1", "fs__write"]


def test_segment_does_not_move_anything_out_of_open() -> None:
    history = history_with_reads(2)

    history.segment(write())

    assert len(history.open) == 2
    assert list(history.committed) == []


# -- settle ----------------------------------------------------------------------------------


def test_accepted_call_commits_the_whole_segment() -> None:
    history = history_with_reads(2)
    held = write()
    segment = history.segment(held)

    history.settle(segment, len(segment))

    assert [s.tool for s in history.committed] == ["fs__read_0", "fs__read_1", "fs__write"]
    assert history.committed[-1] is held
    assert history.open == ()
    assert history.discarded == 0


def test_rejection_commits_the_accepted_prefix_and_counts_the_discarded_steps() -> None:
    history = history_with_reads(3)
    segment = history.segment(write())

    history.settle(segment, 1)

    assert [s.tool for s in history.committed] == ["fs__read_0"]
    assert history.discarded == 3
    assert history.open == ()


def test_rejection_of_everything_commits_nothing() -> None:
    history = history_with_reads(2)
    segment = history.segment(write())

    history.settle(segment, 0)

    assert list(history.committed) == []
    assert history.discarded == 3


def test_discarded_steps_accumulate_over_verdicts() -> None:
    history = history_with_reads(2)
    history.settle(history.segment(write()), 1)
    history.record_read(read(9))

    history.settle(history.segment(write()), 0)

    assert history.discarded == 2 + 2
    assert [s.tool for s in history.committed] == ["fs__read_0"]


def test_a_read_in_two_held_segments_commits_once_and_is_dropped_by_neither_twice() -> None:
    history = history_with_reads(1)
    first, second = history.segment(write("fs__write_a")), history.segment(write("fs__write_b"))

    history.settle(first, len(first))
    history.settle(second, 0)  # everything rejected: the read that already committed stays, once

    assert [s.tool for s in history.committed] == ["fs__read_0", "fs__write_a"]
    assert history.discarded == 1  # the second held call only
    assert history.held == 0 and history.open == ()


def test_executed_replacement_is_committed_after_the_prefix() -> None:
    history = history_with_reads(2)
    segment = history.segment(write("fs__delete"))
    replacement = write("fs__archive")

    history.settle(segment, 2, executed=replacement)

    assert [s.tool for s in history.committed] == ["fs__read_0", "fs__read_1", "fs__archive"]
    assert history.discarded == 1


def test_reads_that_arrived_while_held_stay_open() -> None:
    history = history_with_reads(2)
    segment = history.segment(write())
    late = read(7)
    history.record_read(late)

    history.settle(segment, 1)

    assert [s.tool for s in history.committed] == ["fs__read_0"]
    assert history.open == (late,)
    assert history.open[0] is late
    assert history.discarded == 2


def test_accepted_steps_are_clamped_to_the_segment() -> None:
    history = history_with_reads(1)
    segment = history.segment(write())

    history.settle(segment, 99)

    assert len(history.committed) == 2
    assert history.discarded == 0


def test_negative_accepted_steps_count_as_none() -> None:
    history = history_with_reads(1)
    segment = history.segment(write())

    history.settle(segment, -3)

    assert list(history.committed) == []
    assert history.discarded == 2


def test_equal_but_distinct_steps_are_told_apart_when_settling() -> None:
    history = History()
    history.record_read(read(1))
    segment = history.segment(write())
    twin = read(1)  # same tool and arguments, arrived while the write was held
    history.record_read(twin)

    history.settle(segment, 0)

    assert len(history.open) == 1
    assert history.open[0] is twin


def test_segment_of_a_settled_history_holds_only_new_reads() -> None:
    history = history_with_reads(2)
    history.settle(history.segment(write()), 3)
    history.record_read(read(5))

    segment = history.segment(write("fs__second"))

    assert [s.tool for s in segment.steps] == ["fs__read_5", "fs__second"]


# -- Step ------------------------------------------------------------------------------------


def test_step_json_leaves_out_what_has_not_happened_yet() -> None:
    assert Step("fs__write", {"a": 1}, "write").as_json() == {
        "tool": "fs__write",
        "arguments": {"a": 1},
        "effect": "write",
    }


def test_step_json_includes_intent_and_observation_when_present() -> None:
    step = Step("fs__write", {"a": 1}, "write", observation="denied", is_error=True, intent="tidy up")

    assert step.as_json() == {
        "tool": "fs__write",
        "arguments": {"a": 1},
        "effect": "write",
        "intent": "tidy up",
        "observation": "denied",
        "is_error": True,
    }


def test_segment_length_counts_the_held_call() -> None:
    assert len(Segment((read(0), read(1), write()))) == 3


# -- observation_text ------------------------------------------------------------------------


def test_observation_joins_text_blocks_with_newlines() -> None:
    content: list[dict[str, Any]] = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]

    assert observation_text(content) == "one\ntwo"


def test_observation_of_resources_uses_their_text_or_names_their_uri() -> None:
    content: list[dict[str, Any]] = [
        {"type": "resource", "resource": {"uri": "file:///a", "text": "alpha"}},
        {"type": "resource", "resource": {"uri": "file:///b.png", "blob": "AAAA"}},
    ]

    assert observation_text(content) == "alpha\n[resource file:///b.png]"


def test_observation_of_other_blocks_names_their_kind() -> None:
    content: list[dict[str, Any]] = [{"type": "image", "data": "AAAA", "mimeType": "image/png"}, {"type": "audio"}]

    assert observation_text(content) == "[image content]\n[audio content]"


def test_observation_at_the_limit_is_kept_whole() -> None:
    text = "x" * OBSERVATION_LIMIT

    assert observation_text([{"type": "text", "text": text}]) == text


def test_long_observation_is_truncated_with_a_count_of_what_was_cut() -> None:
    text = "a" * OBSERVATION_LIMIT + "b" * 1234

    observed = observation_text([{"type": "text", "text": text}])

    assert observed == "a" * OBSERVATION_LIMIT + "\n[… 1234 more characters]"
    assert "b" not in observed


def test_empty_content_is_an_empty_observation() -> None:
    assert observation_text([]) == ""


def test_reads_during_a_held_write_never_commit_steps_the_reviewer_rejects() -> None:
    history = History(commit_every=3)
    r0, r1, r2, w = read(0), read(1), read(2), write()
    history.record_read(r0)
    history.record_read(r1)
    segment = history.segment(w)
    history.record_read(r2)  # the K-th read arrives while w is out for review
    assert list(history.committed) == []
    history.settle(segment, 0)
    assert list(history.committed) == []
    assert history.open == (r2,)
    assert history.discarded == 3


def test_released_segment_lets_reads_commit_again() -> None:
    history = History(commit_every=2)
    segment = history.segment(write())
    history.record_read(read(0))
    history.record_read(read(1))
    assert list(history.committed) == []
    history.release(segment)
    history.record_read(read(2))
    assert [s.arguments["n"] for s in history.committed] == [0, 1, 2]
