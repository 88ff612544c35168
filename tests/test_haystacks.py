"""The long-context suite's haystacks (``headwise.tasks.haystacks``): every haystack's samples are deterministic per
seed, fill their length in tokens and state their licence; their needles are in the context the model reads, amid
the haystack's own text; and kv-policy's check runs on a haystack its calibration never used."""

from __future__ import annotations

import random

import pytest

from headwise import HeadwiseError
from headwise.tasks.haystacks import HAYSTACKS, PROSE_FILE, Haystack, parse_haystacks
from headwise.tasks.long_data import TASKS, SuiteSpec, draw, score_answer

LENGTH = 2048
NEEDLED = ("niah_single", "niah_multi", "vt", "qa")  # the tasks whose needles go into the haystack


class Bytes:
    """A tokenizer of UTF-8 bytes: a length in tokens is a length in bytes, and decoding is exact."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    @staticmethod
    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8")


@pytest.fixture(scope="module")
def haystacks() -> dict[str, Haystack]:
    return {name: Haystack.of(name) for name in HAYSTACKS}


def test_four_haystacks_offline_each_with_its_licence(haystacks):
    assert set(HAYSTACKS) == {"generated", "prose", "docs", "code"}
    assert "CC BY-SA 3.0" in haystacks["prose"].licence and "PSF" in haystacks["docs"].licence
    assert "PSF" in haystacks["code"].licence and "project" in haystacks["generated"].licence
    licence = (PROSE_FILE.parent / "LICENSE.txt").read_text(encoding="utf-8")
    assert "Creative Commons Attribution-ShareAlike 3.0" in licence  # shipped beside the text
    assert PROSE_FILE.stat().st_size <= 300_000 and len(haystacks["prose"].sentences) > 500
    assert haystacks["code"].end == "\n" and all(u.endswith("\n") for u in haystacks["code"].sentences[:50])
    for name in ("prose", "docs", "code"):
        assert haystacks[name].source.startswith(name) and "sha256" in haystacks[name].source


@pytest.mark.parametrize("name", list(HAYSTACKS))
def test_samples_are_deterministic_per_seed_fill_their_length_and_name_haystack_and_licence(haystacks, name):
    hay, tokenizer = haystacks[name], Bytes()
    spec = SuiteSpec((LENGTH,), 1, haystack=hay)
    again = SuiteSpec((LENGTH,), 1, haystack=Haystack.of(name))
    other = SuiteSpec((LENGTH,), 1, seed=7, haystack=hay)
    for task in TASKS:
        first, second = draw(tokenizer, task, LENGTH, 3, spec), draw(tokenizer, task, LENGTH, 3, again)
        assert first == second
        assert draw(tokenizer, task, LENGTH, 3, other).context_ids != first.context_ids
        assert 0.9 * LENGTH <= first.tokens <= LENGTH  # the length in tokens is met, and not overshot
    described = spec.describe()
    assert described["haystack_name"] == name and described["licence"] == hay.licence


@pytest.mark.parametrize("name", list(HAYSTACKS))
def test_the_scorer_finds_every_needle_amid_the_haystacks_own_text(haystacks, name):
    hay, tokenizer = haystacks[name], Bytes()
    spec = SuiteSpec((LENGTH,), 1, haystack=hay)
    for task in NEEDLED:
        for index in range(3):
            sample = draw(tokenizer, task, LENGTH, index, spec)
            context = tokenizer.decode(list(sample.context_ids))
            for q in sample.questions:  # an answer that is the context itself holds every expected string
                assert score_answer(context, q.expected, "all") == 1.0, (name, task, index, q.expected)
            if hay.sentences:  # the text around the needles is the haystack's: whole units of it, in order
                inside = [u for u in hay.sentences if u.strip() and u.strip() in context]
                assert len(inside) >= 10, (name, task, index)


def test_a_needle_among_lines_of_code_is_a_line_of_its_own(haystacks):
    sample = draw(Bytes(), "niah_single", LENGTH, 1, SuiteSpec((LENGTH,), 1, haystack=haystacks["code"]))
    lines = Bytes.decode(list(sample.context_ids)).splitlines()
    needle = [line for line in lines if line.startswith("One hidden value for ")]
    assert len(needle) == 1 and needle[0].endswith(sample.questions[0].expected[0] + ".")


def test_a_file_is_a_haystack_and_bad_names_are_refused_in_one_line(tmp_path):
    text = tmp_path / "mine.txt"
    text.write_text("A storm rolled in from the west. " * 20)
    assert Haystack.of(str(text)).name == str(text) and "user" in Haystack.of(str(text)).licence
    assert parse_haystacks("prose, docs") == ("prose", "docs") and parse_haystacks(None) == ("generated",)
    with pytest.raises(HeadwiseError, match="--haystack essays: no such file.*generated, prose, docs, code"):
        Haystack.of("essays")
    with pytest.raises(HeadwiseError, match="--data .*: no such file"):
        Haystack.of(str(tmp_path / "missing.txt"), "--data")
    with pytest.raises(HeadwiseError, match="distinct"):
        parse_haystacks("prose,prose")


def test_the_checks_haystack_is_none_of_the_calibrations():
    """kv-policy's default check runs on natural prose; its calibration prompts are passkeys and fact lookups in
    filler (or numbers, or --data): no prose sentence is a calibration unit, and the check's haystack is not a
    calibration family."""
    from headwise.kvcache.passkey import FILLER, PromptFamily, haystack_units
    from headwise.workflows.kv_policy import KVPolicySettings, SuiteCheck

    check = SuiteCheck(LENGTH)
    calibration = {PromptFamily.parse(n).haystack for n in KVPolicySettings().calibration_families}
    assert check.haystacks == ("prose",) and not calibration & set(check.haystacks)
    units = {u.strip() for family in ("filler", "numbers")
             for u, _ in zip(haystack_units(family, random.Random(0)), range(50))}
    prose = Haystack.of("prose").sentences
    assert not units & {s.strip() for s in prose} and FILLER.split(". ")[0] not in "".join(prose)
    assert SuiteCheck(LENGTH, data=str(PROSE_FILE)).haystacks == ("prose", str(PROSE_FILE))  # the user's text too
