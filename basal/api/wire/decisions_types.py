"""The wire of `POST /v1/decisions`, OpenAI's Decisions API as vLLM serves it.

Read from vLLM's `vllm/entrypoints/openai/decisions/protocol.py` (commit 09e6fa5e) and
`docs/serving/online_serving/decisions.md` (commit 0c47dea5): a request of `model`, `input` (text, or user
messages of text) and an ordered list of `predicate`, `choice` and `score` questions, each with an optional
`name`; answers in question order that echo the name (`null` when none was given); OpenAI's usage object.
Unknown fields are refused, as vLLM refuses them. Errors are `{"error": {message, type, param, code}}`, `code`
the HTTP status.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

ShortText = Annotated[str, Meta(max_length=1 << 20)]
InputText = Annotated[str, Meta(max_length=10 << 20)]
ChoiceValue = str | bool


class InputPart(msgspec.Struct, forbid_unknown_fields=True):
    """One text part of a message (images are not read: their `input_image` parts are refused)."""

    type: Literal["input_text"]
    text: InputText


class InputMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user"]
    content: InputText | Annotated[list[InputPart], Meta(max_length=16384)]
    type: Literal["message"] = "message"


class PredicateQuestion(msgspec.Struct, tag_field="type", tag="predicate", forbid_unknown_fields=True):
    """A yes/no question: the answer is the probability of yes."""

    instructions: ShortText
    name: ShortText | msgspec.UnsetType = msgspec.UNSET


class ChoiceOption(msgspec.Struct, forbid_unknown_fields=True):
    value: ChoiceValue
    description: ShortText = ""


class ChoiceQuestion(msgspec.Struct, tag_field="type", tag="choice", forbid_unknown_fields=True):
    instructions: ShortText
    choices: Annotated[list[ChoiceOption], Meta(min_length=2, max_length=255)]
    name: ShortText | msgspec.UnsetType = msgspec.UNSET


class ScoreLevel(msgspec.Struct, forbid_unknown_fields=True):
    label: ShortText
    description: ShortText = ""


class ScoreQuestion(msgspec.Struct, tag_field="type", tag="score", forbid_unknown_fields=True):
    instructions: ShortText
    levels: Annotated[list[ScoreLevel], Meta(min_length=2, max_length=10)]
    name: ShortText | msgspec.UnsetType = msgspec.UNSET


DecisionQuestion = PredicateQuestion | ChoiceQuestion | ScoreQuestion


class DecisionsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v1/decisions`'s body."""

    model: ShortText
    input: InputText | Annotated[list[InputMessage], Meta(max_length=131072)]
    questions: Annotated[list[DecisionQuestion], Meta(min_length=1, max_length=200)]
    safety_identifier: Annotated[str, Meta(max_length=128)] | None = None


class PredicateAnswer(msgspec.Struct, tag_field="type", tag="predicate"):
    name: str | None
    probability: float


class ChoiceProbability(msgspec.Struct):
    value: ChoiceValue
    probability: float


class ChoiceAnswer(msgspec.Struct, tag_field="type", tag="choice"):
    name: str | None
    choice: ChoiceValue
    probabilities: list[ChoiceProbability]
    confidence: float


class ScoreProbability(msgspec.Struct):
    value: int
    label: str
    probability: float


class ScoreAnswer(msgspec.Struct, tag_field="type", tag="score"):
    name: str | None
    score: float
    probabilities: list[ScoreProbability]
    confidence: float


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class DecisionsUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class DecisionsResponse(msgspec.Struct):
    model: str
    answers: list[PredicateAnswer | ChoiceAnswer | ScoreAnswer]
    usage: DecisionsUsage


class DecisionsErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class DecisionsError(msgspec.Struct):
    """Every refusal of `/v1/decisions`, as vLLM writes it (`code`: the HTTP status)."""

    error: DecisionsErrorInfo
