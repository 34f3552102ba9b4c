"""Call-center transcripts written for tokenq's demos and tests (fictional)."""

from __future__ import annotations

from typing import Any

# Tiny models follow an instruction best when it comes after the transcript.
SYSTEM_PROMPT = "You are a helpful assistant that writes call summaries."
INSTRUCTION = ("Summarise the call as JSON with: issue (the customer's problem), actions "
               "(what the agent did), outcome, follow_up (what happens next) and sentiment.")

# The post-call summary (examples/post_call/summary_schema.json holds the same schema; a test
# keeps them equal). maxLength/maxItems bound the output of a model that likes to ramble.
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "issue": {"type": "string", "maxLength": 160},
        "actions": {"type": "array", "items": {"type": "string", "maxLength": 120},
                    "minItems": 1, "maxItems": 3},
        "outcome": {"type": "string", "maxLength": 160},
        "follow_up": {"type": "string", "maxLength": 120},
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
    },
    "required": ["issue", "actions", "outcome", "follow_up", "sentiment"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "call_summary", "schema": SUMMARY_SCHEMA}}

BILLING_EN = """\
Agent: Thank you for calling Northwind Telecom, this is Priya. How can I help?
Customer: Hi, I was charged twice for my October bill, 49 dollars each time.
Agent: I'm sorry about that. Can I have the account number?
Customer: It's 4471-2209.
Agent: Thanks. I can see two payments of 49 dollars on October 3rd. The second one is a duplicate.
Customer: Can you refund it?
Agent: Yes. I've issued a refund of 49 dollars to your card. It takes three to five business days.
Customer: Okay. Will this happen again?
Agent: It was caused by a retry in our payment system. I've added a note and turned off
automatic retry on your account.
Customer: Great, thanks.
Agent: You'll get a confirmation email today. Anything else?
Customer: No, that's all.
"""

DELIVERY_KO = """\
상담원: 안녕하세요, 한빛택배 고객센터 김민지입니다. 무엇을 도와드릴까요?
고객: 어제 도착 예정이던 택배가 아직 안 왔어요. 송장번호는 5521-8830입니다.
상담원: 확인해 보겠습니다. 물류센터에서 분류가 지연되어 오늘 오후에 배송될 예정입니다.
고객: 오늘 안에 꼭 받아야 하는데요.
상담원: 오후 6시 전 배송으로 우선 처리 요청을 넣었습니다.
배송 기사님 연락처도 문자로 보내드리겠습니다.
고객: 네, 감사합니다.
"""

TRANSCRIPTS = {"billing-en": BILLING_EN, "delivery-ko": DELIVERY_KO}


def summary_messages(transcript: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": (
            f"Here is a customer service call transcript:\n\n{transcript}\n{INSTRUCTION}")},
    ]
