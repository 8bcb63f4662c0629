"""Chat rendering by frames: what a chat template makes of a role sequence, minus the contents.

A frame is the tuple of literal pieces a template writes around the message contents:
`rendered = frame[0] + content[0] + frame[1] + ... + content[n-1] + frame[n]`. Knowing it, a
request renders with string joins only, and the tokenizer can reuse what it knows about the
literals (cached_runs.py).

- `ChatMLRenderer`: ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n` ... then
  `<|im_start|>assistant\\n`), frames built directly.
- `TemplateRenderer`: a Jinja chat template (rendered by transformers' `render_jinja_template`).
  For each role sequence the template is rendered once with sentinel contents; the text between
  the sentinels is the frame. A frame is checked when it is built, against renderings of the
  request and of whitespace-padded sentinels; a template that rewrites contents (trims them,
  say, as Llama 3's does) fails the check and that role sequence has no frame: the template
  renders it every time. Assumed: a template does not branch on what a content says.
At most `max_frames` frames are kept (least recently built first out).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

Turn = tuple[str, str]  # (role, text)
Frame = tuple[str, ...]
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")
_SENTINEL = re.compile("\ue000(\\d+)\ue001")


def message_text(message: Mapping[str, Any]) -> str:
    """A message's content as one string: text parts joined, other parts named, tool calls as
    canonical JSON (a server tokenises them too)."""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping):
                parts.append(f"[{part.get('type', 'part')}]")
        text = "\n".join(parts)
    elif content is None:
        text = ""
    else:
        text = json.dumps(content, sort_keys=True)
    calls = message.get("tool_calls")
    if calls:
        text += json.dumps(calls, sort_keys=True, separators=(",", ":"))
    return text


def turns_of(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    return [(str(m.get("role", "")), message_text(m)) for m in messages]


def interleave(frame: Frame, texts: Sequence[str]) -> str:
    parts = [frame[0]]
    for text, literal in zip(texts, frame[1:], strict=True):
        parts.append(text)
        parts.append(literal)
    return "".join(parts)


class Renderer(Protocol):
    def frame(self, turns: Sequence[Turn]) -> Frame | None:
        """The frame of this request's role sequence, or None (render it in full)."""
        ...

    def render(self, turns: Sequence[Turn]) -> str: ...


class ChatMLRenderer:
    def __init__(self, *, max_frames: int = 4096) -> None:
        self._frames: dict[tuple[str, ...], Frame] = {}
        self._max_frames = max_frames

    def frame(self, turns: Sequence[Turn]) -> Frame:
        roles = tuple(role for role, _ in turns)
        found = self._frames.get(roles)
        if found is None:
            if len(self._frames) >= self._max_frames:
                self._frames.clear()
            heads = [f"<|im_start|>{role}\n" for role in roles]
            pieces = [heads[0], *(f"<|im_end|>\n{h}" for h in heads[1:])]
            found = (*pieces, "<|im_end|>\n<|im_start|>assistant\n")
            self._frames[roles] = found
        return found

    def render(self, turns: Sequence[Turn]) -> str:
        return interleave(self.frame(turns), [text for _, text in turns])


class TemplateRenderer:
    def __init__(self, template: str, *, max_frames: int = 4096) -> None:
        self.template = template
        self._frames: OrderedDict[tuple[str, ...], Frame | None] = OrderedDict()
        self._max_frames = max_frames
        self.fallbacks = 0  # requests the template refused; rendered as ChatML instead

    def frame(self, turns: Sequence[Turn]) -> Frame | None:
        if any("\ue000" in text for _, text in turns):
            return None
        roles = tuple(role for role, _ in turns)
        if roles not in self._frames:
            self._frames[roles] = self._build_frame(turns)
            if len(self._frames) > self._max_frames:
                self._frames.popitem(last=False)
        return self._frames[roles]

    def render(self, turns: Sequence[Turn]) -> str:
        frame = self.frame(turns)
        if frame is None:
            return self.render_full(turns)
        return interleave(frame, [text for _, text in turns])

    def _build_frame(self, turns: Sequence[Turn]) -> Frame | None:
        marked = [(role, f"\ue000{i}\ue001") for i, (role, _) in enumerate(turns)]
        pieces = _SENTINEL.split(self.render_full(marked))
        literals, order = pieces[0::2], pieces[1::2]
        if order != [str(i) for i in range(len(turns))]:
            return None  # the template drops, repeats or reorders contents
        frame = tuple(literals)
        padded = [(role, f" \n{text}\n ") for role, text in marked]
        for probe in (padded, turns):
            if interleave(frame, [text for _, text in probe]) != self.render_full(probe):
                return None
        return frame

    def render_full(self, turns: Sequence[Turn]) -> str:
        from jinja2 import TemplateError
        from transformers.utils.chat_template_utils import render_jinja_template

        messages = [{"role": role, "content": text} for role, text in turns]
        try:
            # Typed `-> str`, but transformers 5 returns (renderings, generation indices).
            result: Any = render_jinja_template(
                [messages], chat_template=self.template, add_generation_prompt=True
            )
        except TemplateError:
            self.fallbacks += 1
            return ChatMLRenderer().render(turns)
        return result if isinstance(result, str) else str(result[0][0])
