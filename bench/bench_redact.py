"""The secret redactor on the chat path (agent/redact.py, channels/egress.py): µs per call.

Prints, for texts of 100, 1,000 and 4,000 characters that hold no secret (nearly every text), the
cost of masking a text, a streamed text (with the half-secret hold-back) and a rendered part with a
payload, for 8 secrets (a daemon with all four platforms and a model key) and for 40 (many
credentials in the environment). Best of 7 rounds: the machine's noise only adds.

    python bench/bench_redact.py
"""

from __future__ import annotations

import random
import string
import timeit

from agent.redact import Redactor
from channels.base import Rendered
from channels.egress import _part


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def main() -> None:
    rng = random.Random(1)
    base = [
        "123456789:AA" + _word(rng, 33),
        "MTA" + _word(rng, 21) + "." + _word(rng, 6) + "." + _word(rng, 38),
        "xoxb-" + _word(rng, 40),
        "xapp-1-" + _word(rng, 50),
        _word(rng, 32),
        "sk-" + _word(rng, 40),
        "postgres-pw-" + _word(rng, 6),
        _word(rng, 24),
    ]
    words = " ".join(_word(rng, rng.randint(2, 9)) for _ in range(2000))
    for secrets in (base, base + [_word(rng, 30) for _ in range(32)]):
        redact = Redactor(secrets)
        print(f"{len(redact.secrets)} secrets, {len(redact._variants)} encoded variants")
        for size in (100, 1000, 4000):
            text = words[:size]
            part = Rendered(text, {"entities": [{"type": "bold", "offset": 0, "length": 5}]})
            n = 5000 if size < 2000 else 1000

            def best(fn: object, n: int = n) -> float:
                return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6  # type: ignore[arg-type]

            print(
                f"  {size:5d} chars: text {best(lambda: redact(text)):6.1f} µs, "  # noqa: B023
                f"stream {best(lambda: redact.stream(text)):6.1f} µs, "  # noqa: B023
                f"part {best(lambda: _part(redact, part)):6.1f} µs"  # noqa: B023
            )


if __name__ == "__main__":
    main()
