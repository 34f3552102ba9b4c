"""Call-center transcripts for the post-call benchmark: made from a seed, the same on every
machine, 200-600 tokens each (the demo's kind: an agent, a customer, an account, amounts
and dates a summary should copy)."""

from __future__ import annotations

import random
from typing import Any

from tokenq.cli.transcripts import RESPONSE_FORMAT, summary_messages

COMPANIES = ["Northwind Telecom", "Contoso Energy", "Fabrikam Bank", "Tailspin Air",
             "Wide World Insurance", "Litware Internet", "Adatum Health", "Proseware Mobile"]
AGENTS = ["Priya", "Marco", "Aisha", "Tom", "Mei", "Jonas", "Lucia", "Samir", "Ines", "Dev"]
CUSTOMERS = ["Mr. Alvarez", "Ms. Chen", "Mr. Okafor", "Ms. Novak", "Mr. Haddad", "Ms. Berg"]
ISSUES = [
    ("I was charged twice for my {month} bill, {amount} dollars each time.",
     "I can see two payments of {amount} dollars on {month} {day}. The second one is a "
     "duplicate.", "I've issued a refund of {amount} dollars to your card."),
    ("my internet has been down since {weekday} morning.",
     "There is a fault on the line to your street, reference {ref}.",
     "I've booked a technician for {weekday} between 8 and 12."),
    ("I lost my card yesterday and I see a payment of {amount} dollars I did not make.",
     "I've blocked the card ending {last4} and flagged the {amount} dollar payment.",
     "A new card will arrive in five business days and the dispute is open as {ref}."),
    ("my flight {flight} on {month} {day} was cancelled and I need to get home.",
     "I can rebook you on flight {flight2} the next morning at 7:40.",
     "You're confirmed on {flight2}, and a hotel voucher for {amount} dollars is on its way."),
    ("my meter reading is wrong, the bill says {kwh} kilowatt hours.",
     "The last reading was estimated, not read. Your real reading is lower.",
     "I've corrected the bill and you'll get a credit of {amount} dollars."),
    ("I want to cancel my subscription, it costs {amount} dollars a month.",
     "I can offer you three months at half price if you stay.",
     "As you asked, the subscription ends on {month} {day} with no further charges."),
]
SMALL_TALK = [
    ("Can I have your account number, please?", "Sure, it's {account}."),
    ("Can you confirm your date of birth?", "It's the {day}th of {month}."),
    ("Thanks. One moment while I look at your account.", "Okay, no problem."),
    ("Is this the best number to reach you on?", "Yes, this one is fine."),
    ("I understand how frustrating that is.", "It really has been a hassle this week."),
    ("Let me check what happened on our side.", "Please do, I've called twice already."),
    ("Could you spell your last name for me?", "Of course, one moment."),
    ("I can see the notes from your earlier call.", "Good, so you know the story."),
]
MONTHS = ["January", "March", "April", "June", "August", "October", "November"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def transcript(rng: random.Random) -> str:
    """One call: greeting, issue, 6-30 exchanges of checks, the fix, the close."""
    fill = {"amount": rng.choice([19, 29, 49, 75, 120, 240]), "month": rng.choice(MONTHS),
            "day": rng.randint(2, 28), "weekday": rng.choice(WEEKDAYS),
            "ref": f"{rng.choice('ABCDEFGH')}{rng.randint(10000, 99999)}",
            "last4": rng.randint(1000, 9999), "account": f"{rng.randint(1000, 9999)}-"
            f"{rng.randint(1000, 9999)}", "flight": f"TW{rng.randint(100, 999)}",
            "flight2": f"TW{rng.randint(100, 999)}", "kwh": rng.randint(400, 2400)}
    agent, company = rng.choice(AGENTS), rng.choice(COMPANIES)
    problem, finding, fix = (s.format(**fill) for s in rng.choice(ISSUES))
    lines = [f"Agent: Thank you for calling {company}, this is {agent}. How can I help?",
             f"Customer: Hi, this is {rng.choice(CUSTOMERS)}, {problem}"]
    for _ in range(rng.randint(3, 15)):
        ask, answer = rng.choice(SMALL_TALK)
        lines += [f"Agent: {ask.format(**fill)}", f"Customer: {answer.format(**fill)}"]
    lines += [f"Agent: {finding}", "Customer: So what can you do about it?",
              f"Agent: {fix}", "Customer: Okay, thank you.",
              "Agent: Is there anything else I can help with today?",
              "Customer: No, that's all. Bye."]
    return "\n".join(lines) + "\n"


def requests(n: int, seed: int, model: str, max_tokens: int) -> list[dict[str, Any]]:
    """n chat requests (OpenAI bodies), one transcript each, the same for a seed."""
    rng = random.Random(seed)
    return [{"model": model, "max_tokens": max_tokens, "temperature": 0,
             "messages": summary_messages(transcript(rng)),
             "response_format": RESPONSE_FORMAT} for _ in range(n)]
