"""The native SDK (basal-client 0.6.0) against a live server: every question type it can ask, the class and the
dictionary forms, discovery, and its typed refusal of what basal does not do."""

from __future__ import annotations

import pytest

basal_client = pytest.importorskip("basal_client")

STATE = "Zamówienie 1234: klient zapłacił 250 zł, paczka dotarła uszkodzona po dwóch tygodniach."


class Ticket(basal_client.Questions):
    dept = basal_client.choice("Do którego działu?", {"logistics": "Logistyka", "billing": "Płatności"})
    refund = basal_client.noul("Czy należy się zwrot?")
    urgency = basal_client.score("Jak pilne?", ["niska", "średnia", "wysoka"])
    tags = basal_client.multi("Czego dotyczy?", {"late": "Opóźnienie", "damage": "Uszkodzenie"}, threshold=0.5)
    route = basal_client.act(
        "Czy wypłacić zwrot?", {"pay": {"true": 0, "false": 5}, "human": {"true": 1, "false": 1}}, defer_action="human"
    )


@pytest.fixture(scope="module")
def sdk(server):
    url, _engines = server
    with basal_client.BasalClient(url) as client:
        yield client


def test_every_question_type_through_the_sdk(sdk):
    result = sdk.decide(STATE, Ticket).answers
    assert result.dept.choice in ("logistics", "billing")
    assert 0 <= result.refund.noul <= 1
    assert set(result.urgency.probabilities) == {"0", "1", "2"}
    assert set(result.tags.selected) <= {"late", "damage"} and result.tags.threshold == 0.5
    assert result.route.action in ("pay", "human") and result.route.answer in ("true", "false")


def test_the_dictionary_form_with_lang(sdk):
    questions = {"q": basal_client.noul("Was the parcel damaged?")}
    pl = sdk.decide("The parcel arrived damaged.", questions, lang="pl").answer("q")
    en = sdk.decide("The parcel arrived damaged.", questions, lang="en").answer("q")
    assert pl.probabilities != en.probabilities  # another prompt, so another answer


def test_discovery(sdk):
    (model,) = sdk.models()["models"]
    assert model["orders"] == 2 and model["temperature_per_prim"]


@pytest.mark.parametrize(
    ("questions", "options"),
    [
        ({"m": basal_client.multi("?", {"a": "A", "b": "B"}, objective="f1")}, {}),
        ({"m": basal_client.multi("?", {"a": "A", "b": "B"}, exclusive=["a"])}, {}),
        ({"q": basal_client.noul("?")}, {"media": [basal_client.image("aGk=")]}),
    ],
)
def test_what_basal_does_not_do_is_a_422_not_a_protocol_error(sdk, questions, options):
    with pytest.raises(basal_client.BasalHTTPError) as e:
        sdk.decide("x", questions, **options)
    assert e.value.status_code == 422 and "not supported" in e.value.body["error"]
