# Parser for the Prometheus text exposition format (version 0.0.4), as served by flux2_server's /metrics.
# Tested by tests/deploy/test_promql_scanner.py (hand-written scrapes); used by test_metrics_contract.py.
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list = field(default_factory=list)  # (sample name, {label: value}, float value)


def parse_labels(text: str) -> dict[str, str]:
    labels, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ValueError(f"bad label set {{{text}}} at offset {pos}")
        labels[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return labels


def _family_of(sample: str, families: dict[str, Family]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[: -len(suffix)]
        if sample.endswith(suffix) and base in families and families[base].type in ("histogram", "summary"):
            return base
    return sample


def parse(text: str) -> dict[str, Family]:
    """Families by name, with their TYPE, HELP and samples. Raises ValueError on a malformed line."""
    families: dict[str, Family] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                fam = families.setdefault(parts[2], Family(parts[2]))
                if parts[1] == "TYPE":
                    fam.type = parts[3].strip() if len(parts) > 3 else "untyped"
                else:
                    fam.help = parts[3] if len(parts) > 3 else ""
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"line {lineno}: not a sample: {line!r}")
        name, _, labels, value, _ = m.groups()
        fam = families.setdefault(_family_of(name, families), Family(_family_of(name, families)))
        fam.samples.append((name, parse_labels(labels or ""), float(value)))
    return families


def exported_names(families: dict[str, Family]) -> set[str]:
    """Every sample name a scrape offers to PromQL, including those of declared families that have
    no sample yet (a labelled counter before its first increment)."""
    names = set()
    for fam in families.values():
        if fam.type == "histogram":
            names |= {fam.name + "_bucket", fam.name + "_sum", fam.name + "_count"}
        elif fam.type == "summary":
            names |= {fam.name, fam.name + "_sum", fam.name + "_count"}
        else:
            names.add(fam.name)
        names |= {s[0] for s in fam.samples}
    return names


def label_names(families: dict[str, Family]) -> dict[str, set[str]]:
    """Sample name -> label names seen on its samples."""
    out: dict[str, set[str]] = {}
    for fam in families.values():
        for name, labels, _ in fam.samples:
            out.setdefault(name, set()).update(labels)
    return out


def value(families: dict[str, Family], sample: str, **labels) -> float:
    """Sum of the samples named `sample` whose labels include `labels` (0 when there is none)."""
    fam = families.get(_family_of(sample, families))
    if fam is None:
        return 0.0
    return sum(v for n, l, v in fam.samples if n == sample and all(l.get(k) == w for k, w in labels.items()))
