"""Deterministic SNLI-like sentence pairs for offline runs (tests, the demo preset).

A premise describes an agent acting on a patient, somewhere or not ("a tall man is chasing a small
dog in the park", "a tall man is chasing a small dog"). Every hypothesis has one form, "a N1 is V a
N2 PLACE ." (nouns, or their hypernyms: "a person is chasing a animal in the park"):
  entailment     the premise's roles and its place
  contradiction  the roles swapped (the same words as an entailment, in another order), or
                 another place than the premise's
  neutral        a place where the premise names none (unverifiable)
Hypotheses alone are alike across the labels (the same words drawn the same way whatever the label),
so the label needs the premise (a head given the hypothesis alone stays at chance:
tests/snli/test_snli.py); and because a role swap contradicts while the same bag of words entails,
it needs word order too. The premise alone is not at chance: one without a place is never an
entailment (a head that reads it alone can reach ~2/3). Same seed, same pairs.
"""

from __future__ import annotations

import random

LABELS = ("entailment", "neutral", "contradiction")  # SNLI's label ids 0, 1, 2

AGENTS = {
    "man": "person",
    "woman": "person",
    "boy": "child",
    "girl": "child",
    "dog": "animal",
    "cat": "animal",
    "chef": "person",
    "teacher": "person",
    "horse": "animal",
    "player": "person",
}
ADJ = ["tall", "small", "young", "old", "happy", "tired", "red", "quiet"]
VERBS = ["chasing", "watching", "following", "pushing", "helping", "photographing", "greeting"]
PLACES = [
    "in the park",
    "on the beach",
    "in a kitchen",
    "on a street",
    "near a river",
    "in a field",
]


def _pair(rng: random.Random) -> tuple[str, str, int]:
    a, p = rng.sample(sorted(AGENTS), 2)
    verb, label = rng.choice(VERBS), rng.randrange(3)
    place = rng.choice(PLACES)  # the hypothesis's: uniform whatever the label
    if label == 0:
        where, first, second = place, a, p
    elif label == 1:
        where, first, second = "", a, p
    elif rng.randrange(2):  # roles swapped, the same place
        where, first, second = place, p, a
    else:  # another place
        where, first, second = rng.choice([x for x in PLACES if x != place]), a, p
    premise = " ".join(
        w
        for w in ("a", rng.choice(ADJ), first, "is", verb, "a", rng.choice(ADJ), second, where, ".")
        if w
    )
    # the hypothesis's nouns: (a, p)
    hyp_a, hyp_p = (x if rng.randrange(2) else AGENTS[x] for x in (a, p))
    # "a animal is chasing a animal" would hold both ways: a swap would not contradict it
    if hyp_a == hyp_p:
        hyp_a, hyp_p = a, p
    return premise, f"a {hyp_a} is {verb} a {hyp_p} {place} .", label


def generate_pairs(n: int, seed: int) -> dict[str, list]:
    """{"premise": [...], "hypothesis": [...], "label": [...]}, SNLI's columns."""
    rng = random.Random(seed)
    rows = [_pair(rng) for _ in range(n)]
    return {
        "premise": [r[0] for r in rows],
        "hypothesis": [r[1] for r in rows],
        "label": [r[2] for r in rows],
    }
