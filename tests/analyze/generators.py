"""Seeded request logs with known ground truth, for the analyzer's tests (and bench/analyze.py).

- `support_bot`: one shared system prompt (~1,900 characters), a fixed set of FAQ questions
  asked again and again, paraphrases of them, and unique questions.
- `drafting_tool`: every prompt unique; tenant `docs` sends a long shared style guide as its
  system prompt, tenant `notes` sends none; half the requests sample without a seed.
- `multi_turn_chat`: conversations whose every turn extends the previous request by the
  assistant's answer and a new question; a few requests are client retries (exact repeats).
- `timestamped_support`: the support bot whose system prompt starts with the current time.
Each returns `Generated(records, truth)`: gateway-style records `{"timestamp", "tenant",
"request", "response"}` in time order, and per-request truth the tests compare against.
"""

from __future__ import annotations

import datetime
import gzip
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = (  # noqa: SIM905 (a paragraph of words reads better than a list literal)
    "account access address agent alert amount answer app archive backup balance bank batch "
    "billing bonus branch browser budget bug cache calendar card cart change channel charge "
    "chart checkout client cloud code coupon credit customer dashboard data database date "
    "deadline delivery deposit design device discount domain download draft email engine error "
    "event export feature fee file filter folder form format gateway graph group guide history "
    "host image import inbox invoice item key label language layout license limit link list "
    "login mail manager market member menu message method metric migration mobile model module "
    "monitor network note notice offer order owner package page panel partner password payment "
    "plan platform plugin policy portal price printer profile project proxy quota rate receipt "
    "record refund region release report request reset role route rule sale schedule screen "
    "script search secret server service session setting share shipment signal site source "
    "space storage store subscription support survey sync system table tag task team template "
    "tenant theme ticket timer token tool topic trace tracker trial update upload user vault "
    "version video view visit volume wallet warning webhook widget window workflow zone"
).split()

SUPPORT_SYSTEM = (
    "You are the customer support assistant of Acme Cloud, a hosting company. Follow these "
    "rules in every answer. 1. Be brief, friendly and precise; answer in at most five "
    "sentences unless the customer asks for detailed steps. 2. Never invent prices, limits "
    "or dates: if the answer depends on the customer's plan, say which plan page to open. "
    "3. For billing questions, explain where the invoice lives (Settings, Billing, Invoices) "
    "and that refunds are processed within ten business days. 4. For login problems, "
    "suggest the password reset link first, then two-factor recovery codes, then contacting "
    "a human agent. 5. Never ask for a password, a full card number or a recovery code. "
    "6. If the customer is angry, acknowledge the problem before giving steps. 7. If a "
    "question is about an outage, point to status.acme.example and do not speculate about "
    "causes. 8. For data export, mention the Export button in the project dashboard and the "
    "JSON and CSV formats. 9. For deletion requests, explain that deleted projects can be "
    "restored for thirty days. 10. For anything about security incidents, hand over to a "
    "human agent and give the incident form link. 11. Use the customer's language. 12. End "
    "every answer by asking whether the problem is solved. Known product areas: projects, "
    "servers, storage buckets, domains, certificates, databases, backups, team members and "
    "roles, API keys, webhooks, usage alerts and invoices. Plans: Starter, Team, Business "
    "and Enterprise; Enterprise customers have a named account manager and a phone line."
)

_FAQ_TABLE = """
How do I reset my password? | How can I reset my password? | how do i reset my password
Where can I download my invoices? | Where do I download my invoices? | where can i download invoices
How do I add a team member? | How can I add a team member? | how do i add team members
Can I get a refund for last month? | Could I get a refund for last month? | can i get a refund
How do I export my project data? | How can I export my project data? | how do i export my data
Why is my server not responding? | Why is my server not answering? | why is my server down
How do I change my billing email? | How can I change my billing email? | change billing email
How do I enable two-factor login? | How can I enable two-factor login? | how do i turn on two-factor
What happens when I delete a project? | What happens if I delete a project? | if i delete it?
How do I create an API key? | How can I create an API key? | how do i create a new api key
How do I connect my domain? | How can I connect my domain? | how do i connect a domain
How do I restore a backup? | How can I restore a backup? | how do i restore from a backup
Is there an outage right now? | Is there an outage at the moment? | is there an outage right now
How do I upgrade my plan? | How can I upgrade my plan? | how do i upgrade the plan
How do I set up a webhook? | How can I set up a webhook? | how do i set up webhooks
How do I renew my certificate? | How can I renew my certificate? | how do i renew the certificate
"""
# (canonical question, (paraphrase, paraphrase))
FAQS: tuple[tuple[str, tuple[str, str]], ...] = tuple(
    (parts[0], (parts[1], parts[2]))
    for parts in (line.split(" | ") for line in _FAQ_TABLE.strip().splitlines())
)


@dataclass
class Truth:
    """What each request is, by construction."""

    exact_repeat: list[bool] = field(default_factory=list)
    paraphrase: list[bool] = field(default_factory=list)  # a FAQ reworded, first time seen
    previous_turn: list[int | None] = field(default_factory=list)  # index of the turn it extends
    tenant: list[str] = field(default_factory=list)


@dataclass
class Generated:
    records: list[dict[str, Any]] = field(default_factory=list)
    truth: Truth = field(default_factory=Truth)

    def add(
        self,
        rng: random.Random,
        ts: float,
        tenant: str,
        body: dict[str, Any],
        prompt_tokens: int,
        *,
        repeat: bool = False,
        paraphrase: bool = False,
        previous_turn: int | None = None,
    ) -> None:
        """One logged request (answered by `body`'s model, `prompt_tokens` long) and its truth."""
        self.truth.exact_repeat.append(repeat)
        self.truth.paraphrase.append(paraphrase)
        self.truth.previous_turn.append(previous_turn)
        self.truth.tenant.append(tenant)
        self.records.append(
            {"timestamp": round(ts, 3), "tenant": tenant, "request": body,
             "response": response(rng, body["model"], prompt_tokens)}
        )  # fmt: skip

    def write(self, path: Path, *, gz: bool = False) -> Path:
        write_lines(path, (json.dumps(r) for r in self.records), gz=gz)
        return path


def write_lines(path: Path, lines: Iterable[str], *, gz: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if gz else text)
    return path


def response(rng: random.Random, model: str, prompt_tokens: int) -> dict[str, Any]:
    completion = rng.randint(40, 160)
    return {
        "id": f"chatcmpl-{rng.randrange(10**12)}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": " ".join(rng.choices(WORDS, k=completion)),
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def _unique_question(rng: random.Random, serial: int) -> str:
    words = " ".join(rng.choices(WORDS, k=rng.randint(6, 12)))
    return f"Question {serial}: my {words} stopped working, what should I check first?"


def support_bot(
    seed: int = 0,
    n: int = 2000,
    *,
    start_s: float = 1_700_000_000.0,
    system: Callable[[float], str] | None = None,
    tenant: str = "acme",
    model: str = "gpt-4o-mini",
) -> Generated:
    """45% canonical FAQ questions, 15% FAQ paraphrases, 40% unique questions; ~20 s apart.
    `system(timestamp_s)`, when given, writes each request's system prompt."""
    rng = random.Random(seed)
    out = Generated()
    seen: set[str] = set()
    ts = start_s
    weights = [1 / (i + 1) for i in range(len(FAQS))]  # Zipf-like popularity
    for i in range(n):
        ts += rng.expovariate(1 / 20)
        draw = rng.random()
        faq, paraphrases = rng.choices(FAQS, weights)[0]
        if draw < 0.45:
            question = faq
        elif draw < 0.60:
            question = rng.choice(paraphrases)
        else:
            question = _unique_question(rng, i)
        sys_text = system(ts) if system is not None else SUPPORT_SYSTEM
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": sys_text},
                {"role": "user", "content": question},
            ],
            "temperature": 0,
        }
        identity = json.dumps(body, sort_keys=True)
        paraphrase = question in {p for _, ps in FAQS for p in ps} and identity not in seen
        out.add(rng, ts, tenant, body, 400, repeat=identity in seen, paraphrase=paraphrase)
        seen.add(identity)
    return out


def timestamped_system(ts: float) -> str:
    stamp = datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")
    return f"Current time: {stamp}\n{SUPPORT_SYSTEM}"


def timestamped_support(seed: int = 0, n: int = 300) -> Generated:
    """The support bot whose system prompt starts with `Current time: <ISO 8601>`."""
    return support_bot(seed, n, system=timestamped_system)


DRAFTING_STYLE_GUIDE = (
    "You are the drafting assistant of the documentation team. Style guide: write in plain "
    "English for busy engineers; prefer short sentences and active voice; one idea per "
    "paragraph; start with what the reader can do, then why; use second person; avoid jargon "
    "unless it is defined on first use; spell out acronyms once; format commands as code; "
    "keep headings in sentence case; never use exclamation marks; use numbered lists for "
    "steps and bullets for options; put warnings before the step they concern; link to the "
    "reference page instead of repeating it; keep examples runnable and minimal; state "
    "defaults and units; describe errors with their exact message and a fix; prefer tables "
    "for comparisons of more than three items; end each page with next steps. Output "
    "Markdown only, with no preamble and no closing remarks. Target length: 300 to 600 "
    "words unless told otherwise. Audience: developers integrating our public API, who read "
    "quickly and skim headings, so every heading must say what the section lets them do. "
    "Terminology: say project, not workspace; say API key, not token; say region, not zone; "
    "write sign in as a verb and sign-in as a noun. Code samples: show the request and the "
    "response, use curl first and then Python, never hard-code a secret, read keys from the "
    "environment. Versioning: name the API version a page was tested with, and mark anything "
    "in preview. Accessibility: every image needs alt text that says what it shows."
)


def drafting_tool(seed: int = 0, n: int = 800, *, start_s: float = 1_700_000_000.0) -> Generated:
    """All prompts unique (150-250 random words first); `docs` shares a long system prompt,
    `notes` has none."""
    rng = random.Random(seed)
    out = Generated()
    ts = start_s
    for i in range(n):
        ts += rng.expovariate(1 / 60)
        tenant = "docs" if rng.random() < 0.5 else "notes"
        topic = " ".join(rng.choices(WORDS, k=rng.randint(150, 250)))
        prompt = f"{topic.capitalize()}: draft {i}, a page about these points."
        messages = [{"role": "user", "content": prompt}]
        if tenant == "docs":
            messages.insert(0, {"role": "system", "content": DRAFTING_STYLE_GUIDE})
        body: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
        if rng.random() < 0.5:
            body["temperature"] = 0.7  # sampled without a seed: not cacheable
        else:
            body["temperature"] = 0
        out.add(rng, ts, tenant, body, 500)
    return out


def multi_turn_chat(
    seed: int = 0, conversations: int = 80, *, start_s: float = 1_700_000_000.0
) -> Generated:
    """Conversations of 3-8 turns, each request extending the last; 5% retried at once."""
    rng = random.Random(seed)
    pending: list[tuple[float, int, dict[str, Any], int | None, bool]] = []
    serial = 0
    for c in range(conversations):
        ts = start_s + rng.uniform(0, 6 * 3600)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."}
        ]
        previous: int | None = None
        for _ in range(rng.randint(3, 8)):
            words = " ".join(rng.choices(WORDS, k=rng.randint(15, 40)))
            messages = [*messages, {"role": "user", "content": f"Chat {c} asks: {words}?"}]
            body = {"model": "gpt-4o-mini", "messages": messages, "temperature": 0}
            original, serial = serial, serial + 1
            pending.append((ts, original, body, previous, False))
            if rng.random() < 0.05:
                pending.append((ts + 2.0, serial, body, previous, True))
                serial += 1
            previous = original
            answer = " ".join(rng.choices(WORDS, k=rng.randint(30, 80)))
            messages = [*messages, {"role": "assistant", "content": answer}]
            ts += rng.uniform(30, 120)
    pending.sort(key=lambda p: (p[0], p[1]))
    position = {p[1]: i for i, p in enumerate(pending)}
    out = Generated()
    for ts, _, body, previous, retry in pending:
        turn = None if previous is None else position[previous]
        out.add(rng, ts, "chat", body, 300, repeat=retry, previous_turn=turn)
    return out


SHORT_SUPPORT_SYSTEM = (
    "You are the support assistant of Acme Cloud. Be brief and precise, at most five "
    "sentences. Never invent prices or dates; point to the plan page instead. Invoices live "
    "in Settings, Billing, Invoices; refunds take ten business days. For login problems "
    "suggest the reset link, then recovery codes, then a human agent. Never ask for a "
    "password or a card number. End by asking whether the problem is solved."
)


def short_support_bot(seed: int = 0, n: int = 1200) -> Generated:
    """The support bot behind a ~150-token system prompt (the prompt a fixed 256-token bar
    would have called no shared prefix at all)."""
    return support_bot(seed, n, system=lambda ts: SHORT_SUPPORT_SYSTEM)


def timestamp_at_end(ts: float) -> str:
    """The timestamped support bot's system prompt with its layout fixed."""
    return f"{SUPPORT_SYSTEM}\n{timestamped_system(ts).splitlines()[0]}"


def _sentence(rng: random.Random, length: int) -> str:
    return " ".join(rng.choices(WORDS, k=length)).capitalize() + "."


def unique_drafts(seed: int = 0, n: int = 400, *, start_s: float = 1_700_000_000.0) -> Generated:
    """A drafting tool: every prompt long (300-600 random words) and unique, nothing in front
    of it, nothing repeated."""
    rng = random.Random(seed)
    out = Generated()
    ts = start_s
    for i in range(n):
        ts += rng.expovariate(1 / 60)
        draft = " ".join(_sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(25, 45)))
        body = {
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": f"{draft}\nDraft {i}: a page from these notes."}
            ],
            "temperature": 0,
        }
        out.add(rng, ts, "drafts", body, 700)
    return out


def document_qa(seed: int = 0, n: int = 400, *, start_s: float = 1_700_000_000.0) -> Generated:
    """One long document (~2,500 words) in the system prompt, a different question each time."""
    rng = random.Random(seed)
    document = "\n".join(_sentence(rng, rng.randint(10, 25)) for _ in range(150))
    system = f"Answer questions about this document only.\n\n{document}"
    out = Generated()
    ts = start_s
    for i in range(n):
        ts += rng.expovariate(1 / 45)
        a, b = rng.sample(WORDS, 2)
        question = f"Question {i}: what does the document say about the {a} and the {b}?"
        body = {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "temperature": 0,
        }
        out.add(rng, ts, "docqa", body, 3000)
    return out


@dataclass(frozen=True)
class Rates:
    """How a generated upstream answers: overhead, then prefill and decode at these rates."""

    overhead_s: float = 0.25
    prefill_tokens_per_s: float = 2_000.0
    decode_tokens_per_s: float = 40.0
    ttft: bool = False  # whether records carry `ttft_ms`


def with_timings(
    gen: Generated, rates: Rates, *, seed: int = 0, noise_s: float = 0.02
) -> Generated:
    """`gen` as the gateway logs misses: layer, status, token counts from the response's
    usage, and upstream timings from `rates` plus a little noise."""
    rng = random.Random(seed)
    out = []
    for record in gen.records:
        usage = record["response"]["usage"]
        prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
        ttft_s = rates.overhead_s + prompt / rates.prefill_tokens_per_s + rng.gauss(0, noise_s)
        total_s = ttft_s + completion / rates.decode_tokens_per_s + rng.gauss(0, noise_s)
        timed = {
            **record,
            "model": record["request"]["model"],
            "layer": "miss",
            "status": 200,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cached_tokens": 0,
            "latency_ms": round(1000 * total_s, 3),
        }
        if rates.ttft:
            timed["ttft_ms"] = round(1000 * ttft_s, 3)
        out.append(timed)
    return Generated(out, gen.truth)


def vary_prompt_lengths(gen: Generated, *, seed: int = 0) -> Generated:
    """The same traffic whose responses report varied prompt sizes (a cost-model fit needs
    prompts of different lengths)."""
    rng = random.Random(seed)
    out = []
    for record in gen.records:
        response_ = dict(record["response"])
        usage = dict(response_["usage"])
        usage["prompt_tokens"] = rng.randint(100, 4000)
        response_["usage"] = usage
        out.append({**record, "response": response_})
    return Generated(out, gen.truth)


def write_twins(
    gen: Generated, directory: Path, *, secret: bytes, tokenizer: Any, policy: Any
) -> tuple[Path, Path]:
    """The same day written twice, as the gateway's request log writes it: plain (with the
    request and response) and redacted (redaction.redact_request's fields instead)."""
    from infercache.redaction import redact_request

    plain, redacted = [], []
    for record in gen.records:
        usage = record["response"]["usage"]
        line = {
            "timestamp": record["timestamp"],
            "tenant": record["tenant"],
            "model": record["request"]["model"],
            "layer": "miss",
            "status": 200,
            "stream": False,
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "cached_tokens": 0,
            "latency_ms": 900.0,
        }
        plain.append({**line, "request": record["request"], "response": record["response"]})
        fields = redact_request(
            record["request"],
            tenant=record["tenant"],
            exact_key=None,
            secret=secret,
            tokenizer=tokenizer,
            policy=policy,
        )
        redacted.append({**line, **fields})
    return (
        write_lines(directory / "plain.jsonl", (json.dumps(r) for r in plain)),
        write_lines(directory / "redacted.jsonl", (json.dumps(r) for r in redacted)),
    )
