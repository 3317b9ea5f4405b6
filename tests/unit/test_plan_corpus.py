"""Every plan of the plan corpus (plan_corpus.py) is what it was when the corpus was recorded.

The corpus holds each distinct planner input of the planner's unit tests and of the demo fleet;
the stored digests hold the sha256 of each plan (JSON, sorted keys) or the refusal verbatim.
A refactor of the planner keeps them all; a wanted change of plans regenerates the digests
(``.venv/bin/python tests/unit/plan_corpus.py digests``) in the commit that explains it.
"""

from __future__ import annotations

import json

import plan_corpus


def test_every_plan_and_refusal_of_the_corpus_is_unchanged():
    calls = plan_corpus.load_inputs()
    stored = json.loads(plan_corpus.DIGESTS.read_text(encoding="utf-8"))
    assert len(calls) == len(stored)
    changed = plan_corpus.differences(calls, stored)
    assert not changed, [(host, was, now) for dummy, host, was, now in changed[:5]]


def test_the_corpus_has_plans_refusals_and_the_demo_fleet():
    calls = plan_corpus.load_inputs()
    stored = json.loads(plan_corpus.DIGESTS.read_text(encoding="utf-8"))
    assert sum("plan" in value for value in stored.values()) > 500
    assert sum("refused" in value for value in stored.values()) > 200
    assert {"gpu-a100-01", "gpu-h100-01", "mi300x-01"} <= {call["host"] for call in calls}
