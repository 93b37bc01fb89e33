"""Synthetic prompts of a known length, built from a small built-in word list.

A prompt of ``prompt_tokens`` words is exactly ``prompt_tokens`` tokens on our sim engine, which
tokenizes on whitespace. On a real engine the word count is only an estimate of the token
count: English text averages about 1.3 tokens per word with common BPE tokenizers, and these
words were chosen short and common so that most are a single token. When the exact prompt
length matters on a real engine, read ``RequestRecord.prompt_tokens`` (from the server's usage
report) rather than trusting the requested length; re-tokenizing on the client with one
tokenizer for every model is a known way to get it wrong.

Prompts are random word sequences rather than one repeated text so that a prefix cache cannot
turn the benchmark into a cache benchmark, and they are seeded so every target and every rerun
gets the same text. The list is built in so that nothing is downloaded.
"""

from __future__ import annotations

import numpy as np

_WORD_TEXT = """
    able about above act add after again age ago air all also always am an and animal answer
    any appear are area arm art as ask at away back ball bank base be bear beat bed been before
    began begin being bell best better between big bird black blue boat body bone book both box
    boy bring brown build built busy but buy by call came can car care carry case cat cause cell
    center change check child city class clean clear close cold color come common cook copy corn
    cost could count country course cover cross cry cut dark day deal dear deep did die differ
    do does dog done door down draw dream dress drink drive drop dry during each early earth
    east easy eat edge egg end enough even ever every eye face fact fall family far farm fast
    father feel feet few field fig fill final find fine fire first fish five floor fly follow
    food foot for force form found four free fresh friend from front full game garden gave get
    girl give glass go gold good got grass great green ground group grow had hair half hand
    happy hard has hat have he head hear heart heat help her here high hill him his hold home
    hope horse hot hour house how huge idea if in inch iron is it its job join just keep kept
    key kind king knew know lake land large last late laugh lay lead learn leave left leg less
    let letter life light like line list little live long look lost lot love low made main make
    man many map mark may me mean meet men might mile milk mind miss money moon more most mother
    move much must my name near need never new next nice night no noise north nose not note now
    number of off often oil old on once one only open or order other our out over own page paint
    paper park part pass past path pay people pick piece place plan plant play point poor power
    press pull push put quick quiet rain ran reach read ready real red rest rich ride right ring
    river road rock room root rose round run safe said sail salt same sand sat save saw say sea
    seat second see seed seem self sell send sent set seven shape share she ship shoe shop short
    show side sign silver simple sing sister sit six size skin sky sleep slow small snow so soft
    soil some son song soon sound south space speak speed spell spring square stand star start
    stay step still stone stop store story street strong such sugar summer sun sure table tail
    take talk tall team tell ten test than that the their them then there these they thin thing
    think this those three time tiny to today told too took top touch town tree true try turn
    two under unit until up us use very visit voice wait walk wall want warm was wash watch water
    wave way we wear week well went were west what wheel when where which while white who why
    wide wife wild will wind window winter wish with woman wood word work world would write
    yard year yes yet you young your
"""

WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""Short, common English words; most are one BPE token."""


def synthetic_prompts(n: int, prompt_tokens: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct prompts of exactly ``prompt_tokens`` words, reproducible by ``seed``.

    Prompts are drawn one after another from one generator, so the first ``k`` prompts for a
    seed do not depend on ``n``: a longer run replays a shorter run's prompts and extends them.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, got {n!r}")
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens: must be an integer >= 1, got {prompt_tokens!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    vocabulary = len(WORDS)
    # Refuse requests that cannot be distinct, or that would make redraws dominate.
    if prompt_tokens * np.log(vocabulary) < np.log(max(2 * n, 1)):
        raise ValueError(
            f"n: {n} distinct prompts of {prompt_tokens} words need a longer prompt_tokens "
            f"(vocabulary is {vocabulary} words)"
        )
    rng = np.random.default_rng(seed)
    words = np.asarray(WORDS)
    seen: set[str] = set()
    prompts: list[str] = []
    while len(prompts) < n:
        prompt = " ".join(words[rng.integers(0, vocabulary, size=prompt_tokens)].tolist())
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """The single-turn chat form of a prompt, so both APIs are sent the same text."""
    return [{"role": "user", "content": prompt}]
