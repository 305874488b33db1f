"""A tiny reader of Prometheus' text format for tests of GET /metrics (no client library)."""

from __future__ import annotations

import re
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')

ESCAPE = re.compile(r"\\(.)")  # in a label value: \\, \" and \n

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _unescaped(match: re.Match[str]) -> str:
    return "\n" if match.group(1) == "n" else match.group(1)


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Prometheus' text format: samples by (name, labels), and each family's TYPE."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match is not None, line
        name, _, label_text, value = match.groups()
        labels = frozenset((key, ESCAPE.sub(_unescaped, raw)) for key, raw, _ in LABEL.findall(label_text or ""))
        assert (name, labels) not in samples, line
        samples[(name, labels)] = float(value)
    return samples, types


def scrape(url: str, key: str | None = None) -> tuple[Samples, dict[str, str]]:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(answer.read().decode())


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples.get((metric, frozenset(labels.items())), 0.0)
