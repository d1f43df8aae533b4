"""Stop strings over streamed text: send what cannot be the start of a stop string, hold back the rest.

As llama-server, a stop string ends the generation and is not part of the output; while the text
ends with a prefix of a stop string (``"<|"`` of ``"<|end|>"``) that part is held back, so a client
never sees text that a later token turns into a stop.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, words: list[str]) -> None:
        self.words = [w for w in words if w]
        self.text = ""
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False
        self.word = ""  # the stop string found

    def feed(self, piece: str) -> str:
        """Add generated text; returns the newly safe text (everything, up to a stop string found)."""
        if self.stopped:
            return ""
        self.text += piece
        safe = len(self.text)
        if self.words:
            longest = max(len(w) for w in self.words)
            start = max(0, self.sent - longest)
            found = [(i, w) for w in self.words if (i := self.text.find(w, start)) >= 0]
            if found:
                i, w = min(found)
                self.text = self.text[:i]
                self.stopped, self.word = True, w
                safe = i
            else:
                safe -= self._partial_len()
        out = self.text[self.sent:safe]
        self.sent = max(self.sent, safe)
        return out

    def _partial_len(self) -> int:
        """The longest end of the text that is a proper prefix of a stop string."""
        best = 0
        for w in self.words:
            for k in range(min(len(w) - 1, len(self.text)), best, -1):
                if self.text.endswith(w[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """At the end: whatever was held back (a partial stop string that never completed)."""
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
