"""The one parser of "N,N-M" lists: sysfs cpulists ("0-3,8,10-11", "0-7:2") and the
calibrate command's field lists ("0-111,120").

Below everything else (it imports nothing from fastpath), so the control plane and the
command line both use it without either importing the other.
"""
from __future__ import annotations

# More values than any list this parses can mean (CPUs of a host, fields of a tick): a typo
# such as "0-1110000000" is an error here instead of a list built until memory runs out
MAX_VALUES = 1 << 20


def parse_ranges(text: str, what: str = "list") -> list:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11], in the order written (duplicates kept);
    'A-B:S' steps by S. Empty parts are skipped. Anything else is a ValueError that names
    `what`, the whole text and the part that is wrong."""
    out: list = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        a, dash, rest = part.partition("-")
        b, colon, stride = rest.partition(":")

        def num(s: str, role: str) -> int:
            s = s.strip()
            # ASCII only: str.isdigit() also takes "²", which int() then refuses with a
            # message that names neither the list nor the part
            if not (s.isascii() and s.isdigit()):
                raise ValueError(f"bad {what} {text!r}: in {part!r} the {role} {s!r} is not a "
                                 f"non-negative integer; expected N, N-M or N-M:S")
            return int(s)

        if not dash:
            if ":" in part:
                raise ValueError(f"bad {what} {text!r}: {part!r} has a step without a range; "
                                 f"expected N, N-M or N-M:S")
            if len(out) >= MAX_VALUES:
                raise ValueError(f"bad {what} {text!r}: more than {MAX_VALUES} values")
            out.append(num(a, "number"))
            continue
        lo, hi = num(a, "start"), num(b, "end")
        step = num(stride, "step") if colon else 1
        if hi < lo:
            raise ValueError(f"bad {what} {text!r}: range {part!r} ends before it starts")
        if step < 1:
            raise ValueError(f"bad {what} {text!r}: range {part!r} has step 0")
        span = range(lo, hi + 1, step)
        if len(out) + len(span) > MAX_VALUES:
            raise ValueError(f"bad {what} {text!r}: range {part!r} holds {len(span)} values; "
                             f"at most {MAX_VALUES} in all")
        out += span
    return out
