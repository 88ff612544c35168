"""Fact-lookup prompts: four ``The COLOUR THING is kept in the ROOM.`` facts spread through a haystack, one of them
asked; the answer is a word found by its key (colour and thing) among facts that all look alike.

A passkey is a number beside a marker no other sentence has; a question about one fact among several (the
long-context suite's ``qa``, a user's document) needs heads that find a word by what surrounds it. The ``lookup``
head score (``scores``) is the attention on the asked room while the model says it. Its words and wording are none
of the long-context suite's (``tasks.long_data``: names, jobs, cities), so that calibrating on them and judging on
the suite stay apart.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Iterator

import torch

from ..errors import HeadwiseError
from .passkey import (Passkey, PromptFamily, Wording, encode, frame, haystack_units, place_needles,
                      text_sentences)

COLOURS = ("red", "blue", "green", "yellow", "black", "white", "brown", "purple", "orange", "grey", "pink", "golden")
THINGS = ("lamp", "chair", "clock", "basket", "kettle", "mirror", "blanket", "ladder", "bucket", "hammer", "violin",
          "bottle")
ROOMS = ("kitchen", "garage", "attic", "cellar", "garden", "bedroom", "hallway", "office", "bathroom", "shed",
         "pantry", "porch")
FACT = "The {thing} is kept in the {room}. "
LOOKUP = Wording("Several things and the rooms they are kept in are mentioned in the text below. Remember them.\n\n",
                 "\n\nWhere is the {thing} kept?", " Answer with the room only.", "The {thing} is kept in the")


def lookup_prompt(tokenizer: Any, length: int, things: list[str], rooms: list[str], depths: list[float],
                  chat: bool | None = None, units: Iterator[str] | None = None) -> Passkey:
    """A prompt of at most about ``length`` tokens: ``FACT`` for each thing and its room at its depth among whole
    haystack ``units`` (default: filler) and the question about ``things[0]``. ``Passkey.key`` is its room,
    ``needle`` the room's tokens inside its fact, ``answer_ids`` the tokens of ``" ROOM"``."""
    if not len(things) == len(rooms) == len(depths) >= 1:
        raise HeadwiseError(f"lookup prompt: {len(things)} things, {len(rooms)} rooms and {len(depths)} depths; give "
                            "one room and one depth per thing (the first is asked)")
    thing, room = things[0], rooms[0]
    wording = replace(LOOKUP, question=LOOKUP.question.format(thing=thing), answer=LOOKUP.answer.format(thing=thing))
    before, after = frame(tokenizer, chat, wording)
    units = units if units is not None else haystack_units("filler", random.Random(0))
    facts = [(d, FACT.format(thing=t, room=r)) for t, r, d in zip(things, rooms, depths)]
    ids, heads = place_needles(tokenizer, length, before, after, facts, units)
    prefix = heads[0] + f"The {thing} is kept in the"
    start, end = len(encode(tokenizer, prefix)), len(encode(tokenizer, prefix + " " + room))
    return Passkey(torch.tensor(ids), room, torch.tensor(encode(tokenizer, " " + room)), (start, end), depths[0])


def lookup_prompts(tokenizer: Any, family: PromptFamily, length: int, depths: list[float], keys: int, facts: int,
                   seed: int = 0, text: str | None = None) -> list[Passkey]:
    """``keys`` prompts with the asked fact at each of ``depths`` (``len(depths) × keys``) in ``family``'s haystack
    (``text``: the running text of the ``text`` haystack), each holding ``facts`` facts (the others at random
    depths), all drawn from ``seed``."""
    if not 1 <= facts <= len(ROOMS):
        raise HeadwiseError(f"facts={facts} per lookup prompt: use 1 to {len(ROOMS)} (0 in ScoreConfig: no lookup)")
    rng = random.Random(f"lookup/{seed}")
    sentences = text_sentences(text) if family.haystack == "text" and text else None
    prompts = []
    for depth in depths:
        for _ in range(keys):
            things = [f"{c} {t}" for c, t in zip(rng.sample(COLOURS, facts), rng.sample(THINGS, facts))]
            where = [depth] + [rng.random() for _ in range(facts - 1)]
            rooms = rng.sample(ROOMS, facts)
            prompts.append(lookup_prompt(tokenizer, length, things, rooms, where, family.chat,
                                         haystack_units(family.haystack, rng, sentences)))
    return prompts
