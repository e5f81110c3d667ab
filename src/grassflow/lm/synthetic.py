"""A deterministic English-like corpus in Wikitext's raw format, for offline runs.

Articles (" = Title = " headings, " = = Section = = " subsections, paragraphs) about one
protagonist, a home place, a founding year and a topic vocabulary. Sentences come from a small
grammar with subject–verb agreement; the protagonist, place, year and topic words recur throughout
the article, so a model with a longer effective context predicts them better: the structure lags and
attention can both exploit. Same seed, same corpus.
"""

from __future__ import annotations

import random

NAMES = [
    "Ada",
    "Boris",
    "Clara",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Lucas",
    "Mara",
    "Nils",
    "Olga",
    "Pavel",
    "Rosa",
    "Sami",
    "Tomas",
    "Vera",
]
PLACES = [
    "Ardmore",
    "Bellhaven",
    "Corrin",
    "Dunmore",
    "Eastwick",
    "Fairlow",
    "Glenrock",
    "Highmoor",
    "Ivybridge",
    "Kestrel",
    "Longford",
    "Marlow",
    "Northam",
    "Oakridge",
]
TOPICS = {
    "music": ["album", "song", "band", "concert", "record", "tour", "singer", "guitar"],
    "war": ["battle", "army", "siege", "fleet", "officer", "regiment", "fort", "treaty"],
    "science": ["theory", "experiment", "journal", "laboratory", "model", "survey", "method"],
    "sport": ["season", "match", "club", "league", "goal", "coach", "stadium", "title"],
    "building": ["church", "tower", "bridge", "station", "hall", "castle", "museum", "road"],
    "nature": ["river", "forest", "species", "island", "valley", "storm", "coast", "lake"],
}
VERBS = [
    ("builds", "built"),
    ("leads", "led"),
    ("writes", "wrote"),
    ("finds", "found"),
    ("joins", "joined"),
    ("visits", "visited"),
    ("describes", "described"),
    ("opens", "opened"),
    ("defends", "defended"),
    ("studies", "studied"),
]
ADJ = ["large", "small", "famous", "early", "new", "old", "major", "local", "final", "second"]
CONNECT = ["Later", "In addition", "However", "After this", "During that time", "Meanwhile"]
SECTIONS = ["Early life", "Career", "History", "Reception", "Legacy", "Background", "Aftermath"]


def _sentence(rng: random.Random, art: dict) -> str:
    topic = art["topic_words"]
    noun, noun2 = rng.choice(topic), rng.choice(topic)
    past = rng.choice(VERBS)[1]
    subj = rng.choice([art["name"], "he" if art["male"] else "she", f"the {noun}"])
    form = rng.randrange(6)
    if form == 0:
        s = (
            f"In {art['year'] + rng.randrange(0, 30)} , {subj} {past} the {rng.choice(ADJ)} "
            f"{noun2} of {art['place']}"
        )
    elif form == 1:
        s = f"{rng.choice(CONNECT)} , {subj} {past} a {rng.choice(ADJ)} {noun2}"
    elif form == 2:
        s = f"The {noun} in {art['place']} was {rng.choice(ADJ)} , and {art['name']} {past} it"
    elif form == 3:
        s = f"{subj} {past} the {noun} @-@ {noun2} since {art['year']}"
    elif form == 4:
        n = rng.randrange(2, 90)
        plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
        s = f"About {n} {plural} were {past} near {art['place']} by {art['name']}"
    else:
        s = f"According to {art['name']} , the {noun2} of {art['place']} was {rng.choice(ADJ)}"
    return s[0].upper() + s[1:] + " ."


def _article(rng: random.Random) -> list[str]:
    topic = rng.choice(sorted(TOPICS))
    art = {
        "name": rng.choice(NAMES),
        "male": rng.random() < 0.5,
        "place": rng.choice(PLACES),
        "year": rng.randrange(1600, 2000),
        "topic_words": TOPICS[topic],
    }
    title = f"{art['name']} of {art['place']}"
    rows = ["", f" = {title} = \n", ""]
    for section in rng.sample(SECTIONS, rng.randrange(2, 4)):
        rows += [f" = = {section} = = \n", ""]
        for _ in range(rng.randrange(1, 3)):
            rows += [
                " " + " ".join(_sentence(rng, art) for _ in range(rng.randrange(3, 7))) + " \n",
                "",
            ]
    return rows


def generate_split(n_articles: int, seed: int) -> list[str]:
    """Rows of one split, in the Hugging Face Wikitext row format."""
    rng = random.Random(seed)
    rows: list[str] = []
    for _ in range(n_articles):
        rows += _article(rng)
    return rows
