"""Varied instructions for the target to answer, so that a draft learns the target's own behaviour beyond
the training text: questions, how-tos, code, lists, dialogue, and prose in several styles.

Every prompt is a genre's template filled with a subject. The subjects are split in two: a draft trains
on the answers to the first part's prompts and is evaluated on answers to the held-out part's, so the
held-out chat answers are about subjects it never saw an answer about.
"""
from __future__ import annotations

import random

GENRES: dict[str, tuple[str, ...]] = {
    "question": ("What is {s}? Explain it to a curious teenager.",
                 "Why does {s} matter? Give a clear answer in a few paragraphs.",
                 "What are the most common misconceptions about {s}?"),
    "how-to": ("Give step-by-step instructions for getting started with {s}.",
               "How would you teach a beginner about {s}? Be practical."),
    "list": ("List ten interesting facts about {s}, one per line.",
             "Make a numbered list of pros and cons of {s}."),
    "dialogue": ("Write a dialogue between two friends who disagree about {s}.",
                 "Write an interview in which a journalist asks an expert about {s}."),
    "story": ("Write a short story in which {s} changes someone's life.",
              "Write the opening of a mystery novel that involves {s}."),
    "poem": ("Write a poem about {s}.",),
    "report": ("Write a short news report about a surprising discovery related to {s}.",
               "Write a formal report summarising the current state of {s}."),
    "letter": ("Write a polite email to a colleague proposing a project about {s}.",
               "Write a letter to the editor complaining about {s}."),
    "essay": ("Write a persuasive essay arguing that everyone should learn about {s}.",
              "Compare and contrast two different views on {s}."),
    "review": ("Write a review of an imaginary book about {s}.",),
    "code": ("Write a Python function related to {s}, with a docstring and an example.",
             "Write a small Python class that models {s}, with type hints.",
             "Write a JavaScript snippet that could be used in a web page about {s}.",
             "Write a SQL schema and two example queries for an app about {s}."),
}

SUBJECTS = (
    "photosynthesis", "black holes", "the French Revolution", "compound interest", "climate change",
    "machine learning", "the immune system", "volcanoes", "the printing press", "honeybees",
    "electric cars", "the stock market", "sleep", "the Roman Empire", "coffee", "chess",
    "recycling", "the human brain", "earthquakes", "democracy", "vaccines", "the moon landing",
    "renewable energy", "ancient Egypt", "music theory", "gardening", "the internet", "inflation",
    "dinosaurs", "public libraries", "friendship", "time management", "the ocean tides", "bread baking",
    "cryptography", "the Silk Road", "marathon running", "bird migration", "smartphones", "jazz",
    "the water cycle", "city planning", "the Industrial Revolution", "meditation", "rainforests",
    "space telescopes", "the Olympic Games", "probability", "volunteering", "the history of medicine",
    "a lighthouse keeper", "a small bakery", "a lost dog", "a train journey", "an old map",
    "a rainy afternoon", "a sailing ship", "a village festival", "a family recipe", "a broken clock",
    "sorting algorithms", "a to-do list app", "temperature conversion", "a bank account", "a library catalogue",
    "prime numbers", "a chess board", "weather data", "a shopping cart", "student grades",
)

HELDOUT_EVERY = 7  # every 7th subject is held out for evaluation


def subjects(heldout: bool) -> list[str]:
    return [s for i, s in enumerate(SUBJECTS) if (i % HELDOUT_EVERY == HELDOUT_EVERY - 1) == heldout]


def _pairs(heldout: bool) -> list[tuple[str, str]]:
    return [(genre, template.format(s=s)) for genre, templates in GENRES.items() for template in templates
            for s in subjects(heldout)]


def prompt_count(heldout: bool = False) -> int:
    """How many different prompts the split has."""
    return len(_pairs(heldout))


def prompts(count: int, heldout: bool = False, seed: int = 0) -> list[tuple[str, str]]:
    """`count` (genre, instruction) pairs over the split's subjects: every template with every subject,
    shuffled (by `seed`), repeated if `count` asks for more than there are. The i-th pair does not depend
    on `count`."""
    pairs = _pairs(heldout)
    random.Random(seed).shuffle(pairs)
    return [pairs[i % len(pairs)] for i in range(count)]
