"""Deterministic SNLI-like sentence pairs for offline runs (tests, the demo preset).

A premise describes an agent acting on a patient somewhere ("a tall man is chasing a small dog
in the park"). Hypotheses:
  entailment     a generalisation: modifiers dropped, nouns replaced by their hypernyms
  contradiction  the roles swapped ("a dog is chasing a man": the same words as an entailment,
                 in another order), an incompatible action, or another place
  neutral        unverifiable added detail (a reason, a time, a possessive)
Because a role swap contradicts while the same bag of words entails, the labels depend on
word order: a head that ignores order cannot reach full accuracy. Same seed, same pairs.
"""

from __future__ import annotations

import random

LABELS = ("entailment", "neutral", "contradiction")  # SNLI's label ids 0, 1, 2

AGENTS = {"man": "person", "woman": "person", "boy": "child", "girl": "child", "dog": "animal",
          "cat": "animal", "chef": "person", "teacher": "person", "horse": "animal", "player": "person"}
ADJ = ["tall", "small", "young", "old", "happy", "tired", "red", "quiet"]
VERBS = ["chasing", "watching", "following", "pushing", "helping", "photographing", "greeting"]
INCOMPATIBLE = ["sleeping alone", "sitting alone at home", "swimming far away", "reading alone"]
PLACES = ["in the park", "on the beach", "in a kitchen", "on a street", "near a river", "in a field"]
REASONS = ["because it is late", "for a contest", "after lunch", "on a sunday", "to win a prize"]


def _pair(rng: random.Random) -> tuple[str, str, int]:
    a, p = rng.sample(sorted(AGENTS), 2)
    adj_a, adj_p = rng.choice(ADJ), rng.choice(ADJ)
    verb, place = rng.choice(VERBS), rng.choice(PLACES)
    premise = f"a {adj_a} {a} is {verb} a {adj_p} {p} {place} ."
    label = rng.randrange(3)
    if label == 0:
        form = rng.randrange(3)
        if form == 0:
            hyp = f"a {a} is {verb} a {p} ."
        elif form == 1:
            hyp = f"a {AGENTS[a]} is {verb} a {AGENTS[p]} {place} ."
        else:
            hyp = f"a {adj_a} {a} is {verb} a {p} ."
    elif label == 1:
        hyp = f"a {a} is {verb} a {p} {rng.choice(REASONS)} ."
    else:
        form = rng.randrange(3)
        if form == 0:
            hyp = f"a {p} is {verb} a {a} ."  # roles swapped: same words as entailment form 0
        elif form == 1:
            hyp = f"the {a} is {rng.choice(INCOMPATIBLE)} ."
        else:
            hyp = f"a {a} is {verb} a {p} {rng.choice([x for x in PLACES if x != place])} ."
    return premise, hyp, label


def generate_pairs(n: int, seed: int) -> dict[str, list]:
    """{"premise": [...], "hypothesis": [...], "label": [...]}, SNLI's columns."""
    rng = random.Random(seed)
    rows = [_pair(rng) for _ in range(n)]
    return {"premise": [r[0] for r in rows], "hypothesis": [r[1] for r in rows], "label": [r[2] for r in rows]}
