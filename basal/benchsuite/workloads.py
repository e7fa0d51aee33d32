"""Seeded synthetic workloads: Polish and English states of a controlled token length, nothing downloaded."""

from __future__ import annotations

import random

from basal.core.model.tokenizer import Tokenizer

PL = (
    "Klient zgłosił, że paczka nr 5521 dotarła uszkodzona, a faktura zawiera błędny numer NIP. Termin zwrotu "
    "wynosi 14 dni od dnia doręczenia. Dział obsługi przyjął reklamację i poprosił o zdjęcia. Płatność kartą "
    "została zaksięgowana dwukrotnie, więc klient żąda zwrotu nadpłaty. Regulamin sklepu przewiduje wymianę "
    "towaru albo zwrot pieniędzy według wyboru kupującego."
).split()
EN = (
    "The customer reports that package 5521 arrived damaged and the invoice lists a wrong VAT number. The return "
    "window is 14 days from delivery. Support accepted the complaint and asked for photos. The card payment was "
    "booked twice, so the customer asks for a refund of the overpayment. The store policy allows an exchange or a "
    "refund at the buyer's choice."
).split()


def state_of_tokens(tokenizer: Tokenizer, target: int, lang: str, seed: int) -> str:
    """A state of about `target` tokens (within a few), shuffled from a PL or EN paragraph."""
    rng = random.Random(seed)
    words = PL if lang == "pl" else EN
    out: list[str] = []
    while True:
        chunk = [rng.choice(words) for _ in range(16)]
        if len(tokenizer.encode(" ".join(out + chunk))) > target:
            break
        out += chunk
    for w in [rng.choice(words) for _ in range(64)]:
        if len(tokenizer.encode(" ".join([*out, w]))) > target:
            break
        out.append(w)
    return " ".join(out)


def questions(n: int, lang: str, seed: int) -> dict[str, dict]:
    """`n` System One questions mixing choice, noul and score."""
    rng = random.Random(seed)
    pl = lang == "pl"
    out = {}
    for i in range(n):
        kind = ("choice", "noul", "score")[i % 3]
        if kind == "choice":
            k = rng.randint(2, 6)
            out[f"q{i}"] = {
                "type": "choice",
                "instructions": "Który dział?" if pl else "Which team?",
                "criteria": {f"opt{j}": rng.choice(PL if pl else EN) for j in range(k)},
            }
        elif kind == "noul":
            out[f"q{i}"] = {
                "type": "noul",
                "instructions": f"Czy punkt {i} jest spełniony?" if pl else f"Is condition {i} met?",
            }
        else:
            out[f"q{i}"] = {
                "type": "score",
                "instructions": "Jak pilne?" if pl else "How urgent?",
                "criteria": ["niska", "średnia", "wysoka"] if pl else ["low", "medium", "high"],
            }
    return out


def bench_items(n: int = 44, seed: int = 0) -> list[dict]:
    """`n` single-question requests covering choice / noul / score in Polish and English (the basal-bench mix)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lang = "pl" if i % 2 else "en"
        kind = ("choice", "noul", "score")[(i // 2) % 3]
        words = PL if lang == "pl" else EN
        state = " ".join(rng.choice(words) for _ in range(rng.randint(20, 60)))
        q = questions(3, lang, seed * 1000 + i)[f"q{('choice', 'noul', 'score').index(kind)}"]
        out.append({"model": "m", "state": state, "questions": {"q": q}})
    return out
